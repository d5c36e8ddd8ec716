package main

import (
	"context"
	"errors"
	"fmt"
	flag "github.com/spf13/pflag"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/tether-run/tether/adapters/store"
)

// The store tools (SPEC §7).

const storeHelp = `

The store is <--data-dir>/tether.db with its blob directory tether.db.blobs/,
as serve keeps them.`

func storeCommands() []*command {
	return []*command{
		{
			path: "store backup", args: "FILE", nargs: 1,
			short: "back up the store while the orchestrator serves",
			long: `Write a consistent backup of the store to FILE (a bbolt store file, as
tether.db) and FILE.blobs/ (the blobs it names), while the orchestrator
serves: the orchestrator copies the store from one read transaction and
streams it with its blobs (GET /api/store/backup); nothing it commits
meanwhile is in the backup, and nothing in it is half written. FILE and
FILE.blobs must not exist: a backup never overwrites. To restore, stop the
orchestrator and serve with FILE as <data-dir>/tether.db and FILE.blobs as
<data-dir>/tether.db.blobs. Every blob's SHA-256 is checked as it arrives.

--offline backs up <--data-dir>/tether.db directly instead, which no
orchestrator may be serving.` + clientHelp + storeHelp,
			example: `  orchestrator store backup /backups/tether-$(date +%F).db
  orchestrator store check /backups/tether-2026-01-31.db`,
			flags: clientFlags(func(fs *flag.FlagSet, o *options) {
				fs.BoolVar(&o.offline, "offline", false, "back up <data-dir>/tether.db directly (no orchestrator may serve it)")
			}),
			run: storeBackup,
		},
		{
			path: "store compact", args: "[FILE]", nargs: -1,
			short: "reclaim the store file's free pages (offline)",
			long: `Rewrite the store file without its free pages, and print its size before and
after. bbolt reuses freed pages but never shrinks its file; compact does, by
copying the store into a new file of the same directory, syncing it and
renaming it over the old one. It is offline: a store an orchestrator serves
is refused (stop it first). FILE defaults to <--data-dir>/tether.db.` + storeHelp,
			example: "  orchestrator store compact --data-dir /var/lib/tether",
			flags: func(fs *flag.FlagSet, o *options) {
				fs.StringVar(&o.dataDir, "data-dir", defaultDataDir, "orchestrator data `directory` holding tether.db")
			},
			run: storeCompact,
		},
		{
			path: "store check", args: "[FILE]", nargs: -1,
			short: "check the store's consistency; exit 4 if it is unsound",
			long: `Read the store and check it (a log a crash left unapplied is first replayed
into it, as serve would; nothing else is written): bbolt's own page check; every record
decodes under its own key; every step's run exists and lists it, and every
lease a step names is its; every current lease's step and worker exist; data
versions, streams and bundles agree with their indexes; every blob the store
names is in the blob directory with its size. One line per finding, then a
summary. A problem makes the store unsound (exit 4); a warning (a record kind
or bucket this version does not know, a blob nobody names) does not. A store
an orchestrator serves is refused: check a backup of it. FILE defaults to
<--data-dir>/tether.db.` + storeHelp,
			example: "  orchestrator store check --data-dir /var/lib/tether\n  orchestrator store check /backups/tether-2026-01-31.db",
			flags: func(fs *flag.FlagSet, o *options) {
				fs.StringVar(&o.dataDir, "data-dir", defaultDataDir, "orchestrator data `directory` holding tether.db")
			},
			run: storeCheck,
		},
	}
}

// storeFileArg is FILE, or the store of --data-dir.
func storeFileArg(e *env, args []string) (string, error) {
	switch len(args) {
	case 0:
		return filepath.Join(e.opts.dataDir, storeFile), nil
	case 1:
		return args[0], nil
	}
	return "", usageErrorf("want at most one argument (FILE), got %q", args)
}

func storeBackup(ctx context.Context, e *env, args []string) error {
	dst := args[0]
	for _, p := range []string{dst, dst + ".blobs"} {
		if _, err := os.Lstat(p); err == nil {
			return usageErrorf("%s exists; a backup never overwrites: name a new file", p)
		}
	}
	if e.opts.offline {
		src := filepath.Join(e.opts.dataDir, storeFile)
		r, w := io.Pipe()
		done := make(chan error, 1)
		go func() {
			err := store.BackupFile(src, w)
			w.CloseWithError(err)
			done <- err
		}()
		err := store.Unpack(r, dst)
		r.CloseWithError(errors.New("unpack stopped"))
		if berr := <-done; berr != nil {
			return berr
		}
		if err != nil {
			return err
		}
		return reportBackup(e, dst)
	}
	// --timeout bounds the wait for the answer to begin; the stream itself
	// takes as long as the store is large.
	c, err := newClient(e, 0)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	timer := time.AfterFunc(e.opts.timeout, cancel)
	body, err := c.Backup(ctx)
	timer.Stop()
	if err != nil {
		return answerErr(err)
	}
	defer body.Close()
	if err := store.Unpack(body, dst); err != nil {
		return fmt.Errorf("backup to %s: %w", dst, err)
	}
	return reportBackup(e, dst)
}

func reportBackup(e *env, dst string) error {
	st, err := os.Stat(dst)
	if err != nil {
		return err
	}
	ents, err := os.ReadDir(dst + ".blobs")
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "backup written: %s (%d bytes) and %s.blobs (%d blobs)\n", dst, st.Size(), dst, len(ents))
	return nil
}

func storeCompact(_ context.Context, e *env, args []string) error {
	path, err := storeFileArg(e, args)
	if err != nil {
		return err
	}
	before, after, err := store.Compact(path)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "compacted %s: %d bytes before, %d after\n", path, before, after)
	return nil
}

func storeCheck(_ context.Context, e *env, args []string) error {
	path, err := storeFileArg(e, args)
	if err != nil {
		return err
	}
	rep, err := store.Check(path)
	if err != nil {
		return err
	}
	for _, f := range rep.Findings {
		fmt.Fprintln(e.stdout, escapeText(f.String(), false))
	}
	fmt.Fprintf(e.stdout, "%s: %s\n", path, rep.Summary())
	if !rep.Sound() {
		return &exitErr{code: exitUnsound, err: errors.New(path + " is unsound: see the problems above")}
	}
	return nil
}
