package warmer

// CanaryTTL is the flush canary's TTL, for tests that outlast it.
const CanaryTTL = canaryTTL
