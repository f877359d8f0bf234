package store

// ClassifyReply runs the refusal table on one Redis error reply text.
func ClassifyReply(msg string) *RefusalError { return refused(msg) }
