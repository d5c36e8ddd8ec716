package pgstore_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/tether-run/tether/adapters/pgstore"
	"github.com/tether-run/tether/adapters/pgtest"
	"github.com/tether-run/tether/core"
)

// BenchmarkApply commits groups shaped like the driver's under load: per
// step its record rewritten, a lease record created then deleted, two log
// lines, and the meta record; steps/group steps per group.
func BenchmarkApply(b *testing.B) {
	for _, steps := range []int{1, 64} {
		b.Run(fmt.Sprintf("steps=%d", steps), func(b *testing.B) {
			s := openB(b)
			value := make([]byte, 400)
			n := 0
			b.ResetTimer()
			for range b.N {
				recs := make([]core.Record, 0, 5*steps+1)
				for range steps {
					n++
					recs = append(recs,
						core.Record{Key: fmt.Sprintf("step/run-1/s%07d", n), Value: value},
						core.Record{Key: fmt.Sprintf("lease/%020d", n), Value: value},
						core.Record{Key: fmt.Sprintf("log/%020d/%010d", n, 0), Value: value},
						core.Record{Key: fmt.Sprintf("log/%020d/%010d", n, 1), Value: value},
						core.Record{Key: fmt.Sprintf("lease/%020d", n-steps), Delete: true})
				}
				recs = append(recs, core.Record{Key: core.KindMeta, Value: value})
				if err := s.Apply(recs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*steps)/b.Elapsed().Seconds(), "steps/s")
		})
	}
}

func openB(b *testing.B) *pgstore.Store {
	if os.Getenv(pgtest.SkipEnv) == "off" {
		b.Skip(pgtest.SkipEnv + "=off: the PostgreSQL benchmarks are skipped")
	}
	if cluster == nil {
		b.Fatalf("no PostgreSQL cluster: %s", clusterErr)
	}
	dsn := cluster.NewDatabase(b)
	admin, err := pgstore.Open(b.Context(), dsn, pgstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Pool().Exec(b.Context(), "UPDATE tether_leader SET epoch = 1"); err != nil {
		b.Fatal(err)
	}
	s, err := pgstore.Open(b.Context(), dsn, pgstore.Options{Epoch: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}
