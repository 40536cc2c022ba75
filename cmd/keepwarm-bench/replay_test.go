package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestLoadTraceExpandsCount(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.lis")
	// Block 10 twice, then a request of 3 blocks starting at 11 (11, 12, 13), then 12 again.
	if err := os.WriteFile(path, []byte("10 1 0 0\n10 1 0 1\n11 3 0 2\n\n12 1 0 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := loadTrace(path, 0)
	if err != nil {
		t.Fatalf("loadTrace: %v", err)
	}
	if want := []string{"10", "11", "12", "13"}; !slices.Equal(w.ids, want) {
		t.Errorf("ids: got %v, want %v", w.ids, want)
	}
	if want := []int32{0, 0, 1, 2, 3, 2}; !slices.Equal(w.seq, want) {
		t.Errorf("reads: got %v, want %v", w.seq, want)
	}
	if w, err := loadTrace(path, 4); err != nil || len(w.seq) != 4 {
		t.Errorf("limit 4: got %d reads (err %v), want 4", len(w.seq), err)
	}
	bad := filepath.Join(t.TempDir(), "bad.lis")
	if err := os.WriteFile(bad, []byte("10 x 0 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadTrace(bad, 0); err == nil {
		t.Error("a bad count: got no error")
	}
}

func TestOLTPTraceShape(t *testing.T) {
	path := defaultTracePath()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the OLTP trace is not at %s (shared/ beside the repository): %v", path, err)
	}
	w, err := loadTrace(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The ARC paper's Table III: 914,145 requests over 186,880 unique pages.
	if len(w.seq) != 914145 || len(w.ids) != 186880 {
		t.Errorf("got %d reads over %d ids, want 914145 over 186880", len(w.seq), len(w.ids))
	}
}

func TestTopK(t *testing.T) {
	seq := []int32{2, 0, 2, 1, 2, 1}
	got, covered := topK(seq, 3, 2)
	if want := []int32{2, 1}; !slices.Equal(got, want) || covered != 5 {
		t.Errorf("got %v covering %d, want %v covering 5", got, covered, want)
	}
}

func TestWasted(t *testing.T) {
	s := int64(time.Second)
	tests := []struct {
		name          string
		seq           []int32
		readAt        []int64
		refIDs        []int32
		refAt         []int64
		judged, waste int64
	}{
		{"read within the TTL", []int32{0}, []int64{3 * s}, []int32{0}, []int64{1 * s}, 1, 0},
		{"read after the TTL", []int32{0}, []int64{20 * s}, []int32{0}, []int64{1 * s}, 1, 1},
		{"read at the refresh instant does not count", []int32{0}, []int64{1 * s}, []int32{0}, []int64{1 * s}, 1, 1},
		{"replaced before any read", []int32{0}, []int64{4 * s}, []int32{0, 0}, []int64{1 * s, 3 * s}, 2, 1},
		{"another id's read does not count", []int32{1}, []int64{2 * s}, []int32{0}, []int64{1 * s}, 1, 1},
		{"window past the end is not judged", []int32{0}, []int64{2 * s}, []int32{0}, []int64{95 * s}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			judged, waste := wasted(2, tt.seq, tt.readAt, tt.refIDs, tt.refAt, 10*s, 100*s)
			if judged != tt.judged || waste != tt.waste {
				t.Errorf("got %d judged, %d wasted; want %d, %d", judged, waste, tt.judged, tt.waste)
			}
		})
	}
}

func TestRefreshAll(t *testing.T) {
	// One id read at 0 s and 9 s; TTL 10 s, so the simulated daemon refreshes every 8.5 s until end − TTL.
	st := refreshAll(1, []int32{0, 0}, []int64{0, int64(9 * time.Second)}, 10*time.Second, int64(30*time.Second))
	// Refreshes at 8.5 s (read at 9 s follows: useful) and 17 s (no read: wasted); 25.5 s + 10 s is past the end.
	if st.Refreshes != 2 || st.Wasted != 1 || st.Warm != 0.5 {
		t.Errorf("got %+v, want 2 refreshes, 1 wasted, warm 0.5", *st)
	}
}

func TestZipfScan(t *testing.T) {
	w := zipfWorkload(1.1, 1000, 20000, 0.1, 1)
	seen := map[int32]int{}
	scans := 0
	last := int32(999)
	for _, i := range w.seq {
		seen[i]++
		if i >= 1000 {
			scans++
			if i != last+1 {
				t.Fatalf("scan id %d follows %d: want a sequential sweep", i, last)
			}
			last = i
		}
	}
	for i := int32(1000); i < int32(len(w.ids)); i++ {
		if seen[i] != 1 {
			t.Errorf("scan id %d read %d times, want once", i, seen[i])
		}
	}
	if got := float64(scans) / float64(len(w.seq)); got < 0.09 || got > 0.11 {
		t.Errorf("scan share: got %.3f, want about 0.1", got)
	}
	if len(w.ids) != 1000+scans {
		t.Errorf("ids: got %d, want %d", len(w.ids), 1000+scans)
	}
}
