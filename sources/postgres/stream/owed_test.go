package stream_test

import (
	"context"
	"slices"
	"testing"

	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/sources/postgres/stream"
)

// OwedResyncs on a real Redis: what Save leaves is what another process's Load reads, and saving nothing removes
// the key.
func TestOwedResyncs(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	key := testenv.Prefix(t, rdb) + "stream:resync"
	ctx := context.Background()
	a := stream.NewOwedResyncs(rdb, key)
	if got, err := a.Load(ctx); err != nil || len(got) != 0 {
		t.Fatalf("Load of nothing: %v, %v; want none", got, err)
	}
	if err := a.Save(ctx, []string{"truncate", "created"}); err != nil {
		t.Fatal(err)
	}
	b := stream.NewOwedResyncs(testenv.Redis(t), key) // another process
	if got, err := b.Load(ctx); err != nil || !slices.Equal(got, []string{"created", "truncate"}) {
		t.Errorf("Load: %v, %v; want [created truncate]", got, err)
	}
	if err := b.Save(ctx, []string{"truncate"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := a.Load(ctx); !slices.Equal(got, []string{"truncate"}) {
		t.Errorf("after saving [truncate]: %v", got)
	}
	if err := b.Save(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, key).Val(); n != 0 {
		t.Errorf("key still there after saving nothing owed")
	}
}
