// Package bench holds fenced's benchmarks (`make bench`); it has no code of
// its own besides this comment, only _test.go files.
//
// What is measured: the throughput of a fenced batch of 1, 8 and 64 puts, run
// in parallel (b.RunParallel, parallelism 4, so 4 goroutines per GOMAXPROCS),
// three ways over one redis-server and one data set in one process, so that
// their ratios come from one run:
//
//   - BenchmarkCommitScript/size=N (a): the commit script called directly
//     with rueidis, with the very command store.Store.Commit sends for the
//     batch (FCALL or EVALSHA, KEYS and ARGV), recorded before the timer
//     starts by a Store whose client keeps script calls instead of sending
//     them (commands_test.go). It is the floor: Redis, the script and one
//     rueidis round trip.
//   - BenchmarkBareForwarder/size=N (b): a gRPC server built here for the
//     benchmark alone, with FencedBatch only and no interceptors: it converts
//     the request (server.BatchFromProto) and calls store.Store.Commit,
//     every error INTERNAL. It adds gRPC, protobuf, the argument building and
//     the reply parsing of the store to (a).
//   - BenchmarkFenced/size=N (c): fenced's own server (server.New, with its
//     logging and recovery interceptors, the batch validation including
//     the JSON check of every value and the duplicate check, and its error table)
//     over the same store, called by the same client.
//
// Target: (c) ÷ (b) ≥ 0.85 in throughput at every size, that is, everything
// fenced adds to a bare forwarder costs at most 15 %.
//
// BenchmarkInterleaved/size=N runs (a), (b) and (c) again, in turn, in short
// rounds (250 ms each, the order rotating per iteration), and takes the
// median of the ratios paired per round. On a machine shared with other
// work, load comes and goes over seconds; the three benchmarks above run
// one after another, so a burst during one of them skews its ratio, while
// the paired rounds see the same load. Its ratios are the verdict to trust.
// One iteration is three rounds (0.75 s), so -benchtime=Nx means N rounds
// of each.
//
// Every run also measures CPU time per batch: of this process (go-cpu-ns/op:
// the gRPC client, the server and the store; getrusage) and of redis-server
// (redis-cpu-ns/op: INFO cpu). They move less with other load than
// throughput does, and (c) − (b) of the process's CPU is what fenced adds.
//
// When the run ends, the test binary prints a summary: (a), (b), (c) in
// ns/op and records/s with the ratios (b)/(a) and (c)/(b) and the verdict,
// and the CPU per batch, for the plain benchmarks (the median over -count
// runs) and for the interleaved rounds.
//
// The workload: the swarm of testdata/swarm-state.json (1352 executions, every
// other section too) is loaded into Redis first, and the lease meta/lease
// (owner "tick-1", epoch 1) is written by hand. Every batch carries the fence
// {owner: "tick-1", epoch: 1} and puts execution-like records of about 940
// bytes (the fixture's executions, each given its own execution_id and agent
// name) to the executions section, so the lease check and the by-name upkeep
// run on every batch. Each goroutine writes its own 128 records, BLIND
// (expected -1), so batches commit and never conflict; (a), (b) and (c) write
// the same records. No batch carries a request_id.
//
// BenchmarkDeployedBatch/size=N is BenchmarkMinimal's fenced side alone
// (fenced as deployed, 16 swarms, one-put, 8-put and 64-put batches of
// ~200-byte values) with allocations per batch: the benchmark to compare
// builds of the server path by (docs/design/10-running-and-operating.md §10.7).
//
// BenchmarkOneRecordChangeBytes counts the bytes Redis reads for one fenced
// change of one fixture executions record through (c), fenced and naming
// the revision it was read at (its digits count too): INFO stats
// total_net_input_bytes before and after, less the cost of an INFO call
// itself (two back-to-back INFOs), the least over all tries. It reports
// redis-bytes/change and overhead-bytes/change (the bytes beyond the value).
//
// BenchmarkWholeSectionCheck is what fencing a section read whole costs: the
// bytes Redis reads and its µs per batch for a fenced one-put batch alone,
// with a WRITE_KIND_CHECK_SECTION of executions, and with a
// WRITE_KIND_CHECK_RECORDS of the fixture's 1,352 executions, beside a
// Sections read of executions (docs/design/03-fenced-batch.md §3.4).
package bench
