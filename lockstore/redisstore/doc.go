// Package redisstore keeps flightlock's locks in Redis: RedisStore implements lockstore.Store
// (and Passer) on go-redis v9's UniversalClient (single node,
// Sentinel failover or Cluster), with one Lua script per operation beside the Go that runs it,
// release notifications over pub/sub, calls batched into pipelines per lane, and optional
// replica acknowledgement (WAIT). RedisInspector reads the values those scripts write, for
// tools (the flightlock CLI). The package imports go-redis and the standard library only; the
// same store on an in-process miniredis is in lockstore/embedded, and the constructor from
// go-zero's RedisConf is middleware.NewStore.
package redisstore
