-- read_record.lua: one record and the swarm revision, read together.
-- KEYS[1] revision, KEYS[2] the section hash; ARGV[1] the record's key.
-- Reply: { revision, raw } where raw is nil when the record is absent.
return { redis.call('GET', KEYS[1]) or '0', redis.call('HGET', KEYS[2], ARGV[1]) }
