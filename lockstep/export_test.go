package lockstep

// UseSetNXFallback makes c acquire locks as on a server older than Redis 7.0, which refuses SET NX GET: a plain
// SET NX and, on a nil reply, a GET of the lock (see acquireOp). Tests use it to run the fallback against Redis 7.
func UseSetNXFallback(c RedisClient) { markRefusesSetGet(c) }
