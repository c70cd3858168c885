// Package redisstore keeps flightlock's locks in Redis: RedisStore implements lockstore.Store
// and Passer on go-redis v9 (single node, Sentinel failover or Cluster), with one Lua script
// per operation, release notifications over pub/sub, calls batched into pipelines per lane,
// and optional replica acknowledgement (WAIT). RedisInspector reads the values those scripts
// write, for tools. The package imports go-redis and the standard library only; see also
// lockstore/embedded (in-process miniredis) and middleware.NewStore (go-zero's RedisConf).
package redisstore
