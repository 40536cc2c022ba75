// Package config loads keepwarm's TOML configuration (koanf v2), applies KEEPWARM_* environment overrides,
// fills in defaults and validates it, reporting every problem at once with the path of its field:
//
//	config.toml: 2 problems:
//	  keyspace "track": ttl: "5x" is not a duration (write a number with a unit: "500ms", "30s", "5m", "1h")
//	  schedule "nightly": list: "black-friday" is not a [[hotkeys]] name (known: launch)
//
// A [[keyspace]]'s keys are listed once, in KeyspaceFields (key, type, default, bound, doc): the decoder, the
// printout and `keepwarm validate`'s summary walk that table, and the keys decode straight into the embedded
// warmer.KeyspaceConfig, whose Resolve owns their defaults and bounds.
//
// Unknown keys are errors, so a typo is never silently ignored. The documented example is config.toml at the
// repository root. Secrets (the Redis passwords and the password in the PostgreSQL DSN) are Secret values or
// are masked by Redacted, String and LogValue: they never reach logs or `keepwarm validate`.
package config
