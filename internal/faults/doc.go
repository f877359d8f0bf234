// Package faults holds fenced's fault-injection and linearizability tests
// (issue 5), all bounded so that the package runs in about a minute with
// -race:
//
//   - TestLinearizable: histories of 8 clients over 2 fenced replicas of one
//     Redis (fenced, unfenced and stale-fenced batches of puts, deletes,
//     checks and section checks; Record and Sections reads; 5 records),
//     checked with porcupine against a model of records and revisions
//     (model_test.go). TestModelRejectsAnomalies pins the model itself.
//   - Faults during such histories: Redis SIGKILLed and restarted (AOF,
//     appendfsync always), a fenced replica killed or shut down and
//     restarted, SCRIPT FLUSH, every Redis connection cut by a proxy.
//     Batches of unknown outcome are resolved through the swarm's log by
//     their request ids; every acknowledged commit must be in the log.
//   - TestLostReply (a proxy forwards a commit and drops its reply),
//     TestSlowRedis (DEBUG SLEEP against 50 ms deadlines).
//   - TestClusterFailover: 3 primaries with a replica each, CLUSTER FAILOVER
//     and a SIGKILLed primary under load with replica_ack replicas=1.
//   - TestLeaseRaces: 1,000 races of a stalled holder against a takeover.
//   - TestCorruptField, TestBatchesStayInTheirSwarm: fields that are not
//     records, and no input reaching a key outside its swarm.
//
// Knobs: FAULTS_SEED replays one seed (every randomised test logs its
// own); FAULTS_HISTORIES and FAULTS_OPS (calls per client) scale the
// histories; FAULTS_LEASE_RACES the races; FAULTS_VIZ_DIR is where a
// non-linearizable history's porcupine visualisation is written (default:
// a new directory under the system's temporary directory, kept).
//
// Besides the tests the package holds Proxy, a loopback TCP proxy that can
// lose a reply or cut every connection.
package faults
