-- byname_none.lua: the by-name code left out. The commit of a batch that
-- puts or deletes in no execution runs commit.lua after this file instead
-- of byname.lua (lua.go, luaCommit): `byname` is nil, so commit.lua neither
-- reads nor sends the executions and by-name keys.
local byname = nil
