// Package benchload holds what the keepwarm-bench commands and the soak (internal/soak) share: the Zipf readers
// that drive keyspaces through lockstep clients (Space, StartReaders), the track-row updater (RunUpdates), the
// daemon's /debug/hotkeys reader (DaemonStatus), and small helpers to reach the services (NewRedis, NewPool,
// ModuleRoot) and to format what they measure (Dur, Percentile).
//
// It is library code for a shipped binary, so it must not import package testing.
package benchload
