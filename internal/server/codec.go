package server

import (
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// preEncoded is a message already in its wire form: parts concatenated.
// Watch sends one: a WatchResponse's repeated events field encodes as the
// concatenation of each event's own encoding (as a WatchResponse holding it
// alone), so every watcher of a batch shares one encoding of its event and
// a coalesced message costs no marshalling at all.
type preEncoded struct{ parts [][]byte }

// codec is grpc-go's proto codec, passing preEncoded messages through
// unchanged (grpc.ForceServerCodecV2 installs it on fenced's server). The
// parts are shared and never written: SliceBuffer's Free does nothing.
type codec struct{ encoding.CodecV2 }

func newCodec() codec { return codec{encoding.GetCodecV2(grpcproto.Name)} }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if p, ok := v.(*preEncoded); ok {
		out := make(mem.BufferSlice, 0, len(p.parts))
		for _, b := range p.parts {
			out = append(out, mem.SliceBuffer(b))
		}
		return out, nil
	}
	return c.CodecV2.Marshal(v)
}
