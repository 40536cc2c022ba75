package config

import (
	"errors"
	"time"

	"github.com/keepwarm/keepwarm/warmer"
)

// Fleet is the [fleet] section: how replicas share the hot keys. warmer.FleetConfig holds the defaults, units
// and bounds of these fields; zero values here mean its defaults.
type Fleet struct {
	Enabled bool // share the work with the other replicas of the same keyspaces; default true
	// Key is the member set's Redis key; "" means warmer.DefaultFleetKey of the keyspaces' cache-key templates,
	// so that replicas with the same keyspaces form one fleet.
	Key               string
	ReplicaID         string        // this replica's id; "" means warmer.DefaultReplicaID() (hostname-pid)
	HeartbeatInterval time.Duration // see warmer.FleetConfig.HeartbeatInterval
	HeartbeatTTL      time.Duration // see warmer.FleetConfig.HeartbeatTTL
}

func decodeFleet(t *table, f *Fleet) {
	f.Enabled = true
	t.boolean("enabled", &f.Enabled)
	t.str("key", &f.Key)
	t.str("replica_id", &f.ReplicaID)
	t.duration("heartbeat_interval", &f.HeartbeatInterval)
	t.duration("heartbeat_ttl", &f.HeartbeatTTL)
	t.done()
	if t.d.known != nil {
		return
	}
	_, err := warmer.FleetConfig{Key: "check", ReplicaID: f.ReplicaID, HeartbeatInterval: f.HeartbeatInterval,
		HeartbeatTTL: f.HeartbeatTTL}.Resolve()
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	for _, e := range errs {
		var fe *warmer.FleetFieldError
		if errors.As(e, &fe) {
			t.problem(fe.Field, "%s", fe.Msg)
		}
	}
}
