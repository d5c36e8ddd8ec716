package orchestrator_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-run/tether/adapters/worker"
	"github.com/tether-run/tether/core"
)

// TestWorkerSavesCredentialFirst: the worker driver hands the enrollment
// Welcome's credential to SaveCredential before it acts on anything else
// (SPEC §9): a run already waiting is dispatched with the Welcome, and its
// step has not started when the credential is saved. If saving fails, Run
// stops with ErrSaveCredential and the step never starts on this worker.
func TestWorkerSavesCredentialFirst(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	d := startOrch(t, "127.0.0.1:0", filepath.Join(t.TempDir(), "tether.db"))
	defer d.Close()
	dir := t.TempDir()
	for _, fail := range []bool{false, true} {
		name := "saves"
		if fail {
			name = "cannot-save"
		}
		// A run waits for the worker: it is dispatched with the Welcome.
		marker := filepath.Join(dir, name)
		if _, err := d.Submit(ctx, core.RunSpec{Name: name, Steps: []core.StepSpec{{Name: "a", Command: "touch " + marker}}}); err != nil {
			t.Fatal(err)
		}
		tok, err := d.CreateToken(ctx, name, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		var saved []string
		ranAtSave := false
		w, err := worker.New(worker.Options{URL: d.URL(), Logger: testLogger(t).With("side", "worker", "name", name),
			Config: core.WorkerConfig{Name: name, Token: tok, BackoffBase: 50 * time.Millisecond, BackoffMax: time.Second},
			SaveCredential: func(c string) error {
				saved = append(saved, c)
				_, err := os.Stat(marker)
				ranAtSave = ranAtSave || err == nil
				if fail {
					return errors.New("disk full")
				}
				return nil
			}})
		if err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { _, err := w.Run(wctx); done <- err }()
		if fail {
			if err := <-done; !errors.Is(err, worker.ErrSaveCredential) {
				t.Fatalf("Run with a failing SaveCredential returned %v, want ErrSaveCredential", err)
			}
		} else {
			poll := time.NewTicker(20 * time.Millisecond)
			for _, err := os.Stat(marker); err != nil; _, err = os.Stat(marker) {
				select {
				case <-ctx.Done():
					t.Fatal("the step never ran")
				case <-poll.C:
				}
			}
			poll.Stop()
		}
		wcancel()
		if !fail {
			<-done
		}
		if len(saved) != 1 || !strings.HasPrefix(saved[0], string(w.ID())+".") {
			t.Errorf("%s: SaveCredential called with %q, want once with the credential", name, saved)
		}
		if ranAtSave {
			t.Errorf("%s: the step ran before the credential was saved", name)
		}
		if _, err := os.Stat(marker); fail && err == nil {
			t.Fatalf("%s: the step ran although the credential could not be saved", name)
		}
	}
}
