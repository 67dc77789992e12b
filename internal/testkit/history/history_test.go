package history

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func TestWriteRead(t *testing.T) {
	p := filepath.Join(t.TempDir(), "h.jsonl")
	w, err := Create(p)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for range 100 {
				w.Write(Event{Kind: KindServe, ID: "x", Via: i})
			}
		})
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	// A torn last line (SIGKILL mid-write) is skipped.
	f, _ := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"t":1,"k":"ser`)
	f.Close()
	ev, err := Read(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(ev) != 800 {
		t.Fatalf("read %d events; want 800", len(ev))
	}
	for _, e := range ev {
		if e.T == 0 || e.Kind != KindServe {
			t.Fatalf("bad event %+v", e)
		}
	}
}

func TestSharedClock(t *testing.T) {
	a := Now()
	at := At(time.Now().Add(-time.Second))
	if d := a - at; d < int64(900*time.Millisecond) || d > int64(1100*time.Millisecond) {
		t.Fatalf("At(now-1s) is %v before Now", time.Duration(d))
	}
}
