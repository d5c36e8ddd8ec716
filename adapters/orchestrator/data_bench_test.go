package orchestrator_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/tether-run/tether/adapters/orchestrator"
)

// BenchmarkDataPut measures durable PUTs over h2c on loopback into a real
// bbolt file (fsync per group commit): one writer at a time, and many at
// once (their writes share commits).
func BenchmarkDataPut(b *testing.B) {
	for _, size := range []int{1 << 10, 1 << 20} {
		for _, parallel := range []bool{false, true} {
			b.Run(fmt.Sprintf("size=%dKiB/parallel=%v", size>>10, parallel), func(b *testing.B) {
				r := startData(b, orchestrator.Options{})
				w := r.enroll("w1")
				dm := r.lease(w, "s")
				c := r.client(w.cred)
				body := bytes.Repeat([]byte("x"), size)
				b.SetBytes(int64(size))
				b.ResetTimer()
				if !parallel {
					for b.Loop() {
						if _, err := c.Put(r.ctx, dm.Lease, "bench", bytes.NewReader(body), int64(size)); err != nil {
							b.Fatal(err)
						}
					}
					return
				}
				b.SetParallelism(8)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if _, err := c.Put(r.ctx, dm.Lease, "bench", bytes.NewReader(body), int64(size)); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}

// BenchmarkDataAppend measures durable 100-byte appends (live-log lines)
// from many writers at once, and GETs of a 1 KiB version.
func BenchmarkDataAppend(b *testing.B) {
	r := startData(b, orchestrator.Options{})
	w := r.enroll("w1")
	dm := r.lease(w, "s")
	c := r.client(w.cred)
	line := bytes.Repeat([]byte("l"), 100)
	b.SetBytes(int64(len(line)))
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Append(r.ctx, dm.Lease, "bench.log", line); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkDataGet(b *testing.B) {
	r := startData(b, orchestrator.Options{})
	w := r.enroll("w1")
	dm := r.lease(w, "s")
	c := r.client(w.cred)
	body := bytes.Repeat([]byte("g"), 1<<10)
	if _, err := c.Put(r.ctx, dm.Lease, "bench", bytes.NewReader(body), int64(len(body))); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	b.ResetTimer()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 2<<10)
		for pb.Next() {
			rc, _, err := c.Get(r.ctx, "bench", 1)
			if err != nil {
				b.Error(err)
				return
			}
			n, _ := rc.Read(buf)
			for n < len(body) {
				m, err := rc.Read(buf[n:])
				n += m
				if err != nil {
					break
				}
			}
			rc.Close()
		}
	})
}
