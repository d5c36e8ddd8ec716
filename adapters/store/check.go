package store

// Check reads a store file (offline, or a backup) and cross-checks what it
// holds (SPEC §7). It is a list of small named checks, each reading the
// buckets it knows; a bucket no check reads and a record kind the core
// does not decode are reported, not failed, so a store written by a newer
// orchestrator can still be checked. Adding a check for a new bucket is one
// entry of checks.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/tether-run/tether/core"
)

// Finding is one thing Check found.
type Finding struct {
	Check   string // the check that found it
	Problem bool   // the store is unsound; else a warning
	Where   string // a bucket, a key, a blob
	What    string
}

func (f Finding) String() string {
	sev := "warning"
	if f.Problem {
		sev = "PROBLEM"
	}
	return fmt.Sprintf("%s [%s] %s: %s", sev, f.Check, f.Where, f.What)
}

// Report is what Check found, in the order of its checks.
type Report struct {
	Findings []Finding
	// Counted says how many of each thing were read ("records", "run",
	// "blob files", …), for the summary.
	Counted map[string]int
}

// Sound says whether no finding is a problem (warnings are allowed).
func (r *Report) Sound() bool {
	for _, f := range r.Findings {
		if f.Problem {
			return false
		}
	}
	return true
}

// Problems and Warnings count the findings of each severity.
func (r *Report) Problems() int { return r.count(true) }

// Warnings counts the findings that are not problems.
func (r *Report) Warnings() int { return r.count(false) }

func (r *Report) count(problem bool) int {
	n := 0
	for _, f := range r.Findings {
		if f.Problem == problem {
			n++
		}
	}
	return n
}

// Summary is one line: what was read and what was found.
func (r *Report) Summary() string {
	keys := make([]string, 0, len(r.Counted))
	for k := range r.Counted {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, r.Counted[k]))
	}
	verdict := "sound"
	if !r.Sound() {
		verdict = "UNSOUND"
	}
	return fmt.Sprintf("%s: %d problems, %d warnings (read: %s)", verdict, r.Problems(), r.Warnings(), strings.Join(parts, ", "))
}

// check is one named check and the buckets it reads.
type check struct {
	name    string
	buckets [][]byte
	run     func(c *checker)
}

// checks run in order: "records" decodes what the later record checks
// cross-check. (Set in init: checkBuckets reads the list.)
var checks []check

func init() {
	checks = []check{
		{"bbolt", nil, checkBolt},
		{"buckets", nil, checkBuckets},
		{"records", liveBuckets, checkRecordValues},
		{"runs", nil, checkRuns},
		{"history", [][]byte{bktHistory, bktRunsBySeq, bktRunsByFinish, bktHistoryStats}, checkHistory},
		{"archived", nil, checkArchived},
		{"log lines", [][]byte{bktLogs, bktPruning}, checkLogs},
		{"steps", nil, checkSteps},
		{"leases", nil, checkLeases},
		{"data", [][]byte{bktData, bktDataChunk}, checkData},
		{"streams", [][]byte{bktStream, bktStreamChunk}, checkStreams},
		{"bundles", [][]byte{bktBundle, bktBundleChunk, bktBundleFile}, checkBundles},
		{"blobs", [][]byte{bktBlob}, checkBlobIndex},
		{"blob owners", [][]byte{bktBlobBy}, checkBlobBy},
		{"blob files", nil, checkBlobFiles},
		{"audit", [][]byte{bktAudit}, checkAudit},
		{"requests", [][]byte{bktRequest, bktRequestCount}, checkRequests},
		{"secrets", [][]byte{bktSecret}, checkSecrets},
		{"log", [][]byte{bktWAL}, checkWAL},
	}
}

// checker is the state the checks share.
type checker struct {
	tx      *bolt.Tx
	blobDir string
	rep     *Report
	name    string // the running check

	runs    map[core.RunID]*core.RunRecord
	steps   map[core.StepID]*core.StepRecord
	leases  map[core.LeaseID]*core.LeaseRecord
	workers map[core.WorkerID]*core.WorkerRecord
	blobs   map[string]int64 // the blob index: sha256 → size
	// archived holds the runs with a history record (SPEC §7a), and
	// archivedLeases their leases.
	archived       map[core.RunID]bool
	archivedLeases map[core.LeaseID]bool

	keyed *Store // holds the secrets key found next to the store, if any (secrets.go)
}

func (c *checker) problem(where, format string, args ...any) {
	c.rep.Findings = append(c.rep.Findings, Finding{Check: c.name, Problem: true, Where: where, What: fmt.Sprintf(format, args...)})
}

func (c *checker) warn(where, format string, args ...any) {
	c.rep.Findings = append(c.rep.Findings, Finding{Check: c.name, Where: where, What: fmt.Sprintf(format, args...)})
}

func (c *checker) count(what string, n int) { c.rep.Counted[what] += n }

// each runs f over a bucket in key order; a missing bucket is skipped
// (checkBuckets reports it).
func (c *checker) each(name []byte, f func(k, v []byte)) {
	b := c.tx.Bucket(name)
	if b == nil {
		return
	}
	_ = b.ForEach(func(k, v []byte) error {
		f(k, v)
		return nil
	})
}

// eachOf is each over several buckets, naming the bucket.
func (c *checker) eachOf(names [][]byte, f func(name, k, v []byte)) {
	for _, name := range names {
		c.each(name, func(k, v []byte) { f(name, k, v) })
	}
}

// Check reads the store file at path and its blob directory (a store an
// orchestrator serves is ErrLocked: check a backup of it). It changes
// nothing, except that a log a crash left unapplied is replayed into the
// file first (SPEC §7), as Open would. The
// error is for a store that cannot be read at all; everything else is a
// finding.
func Check(path string) (*Report, error) {
	db, err := openReadOnly(path)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	rep := &Report{Counted: map[string]int{}}
	keyed, err := keyNextTo(path, db)
	if err != nil {
		return nil, err
	}
	err = db.View(func(tx *bolt.Tx) error {
		c := &checker{keyed: keyed,
			tx: tx, blobDir: path + ".blobs", rep: rep,
			runs: map[core.RunID]*core.RunRecord{}, steps: map[core.StepID]*core.StepRecord{},
			leases: map[core.LeaseID]*core.LeaseRecord{}, workers: map[core.WorkerID]*core.WorkerRecord{},
			blobs: map[string]int64{}, archived: map[core.RunID]bool{}, archivedLeases: map[core.LeaseID]bool{},
		}
		for _, ck := range checks {
			c.name = ck.name
			ck.run(c)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: check %s: %w", path, err)
	}
	return rep, nil
}

// checkBolt is bbolt's own check of the file's pages.
func checkBolt(c *checker) {
	for err := range c.tx.Check() {
		c.problem("file", "%v", err)
	}
}

// checkBuckets: every bucket the store creates exists, and every bucket is
// read by some check (warnings: what a bucket holds is checked by its own
// check).
func checkBuckets(c *checker) {
	known := map[string]bool{}
	for _, ck := range checks {
		for _, b := range ck.buckets {
			known[string(b)] = true
		}
	}
	for _, b := range append([][]byte{bucket, bktRuns, bktMeta, bktBlob}, dataBuckets...) {
		if c.tx.Bucket(b) == nil {
			// A store written by an older version: its next start creates it.
			c.warn("bucket "+string(b), "missing (the next start creates it)")
		}
	}
	_ = c.tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
		c.count("buckets", 1)
		if !known[string(name)] {
			c.warn("bucket "+core.Quote(string(name)), "no check reads this bucket")
		}
		return nil
	})
}

// knownKinds are the record kinds whose values must decode.
var knownKinds = map[string]bool{
	core.KindMeta: true, core.KindRun: true, core.KindStep: true, core.KindLease: true,
	core.KindWorker: true, core.KindToken: true, core.KindEvent: true, core.KindLog: true,
	core.KindHistory: true, core.KindClosed: true, core.KindOperator: true,
	core.KindSecret:   true,
	core.KindSchedule: true,
}

// checkRecordValues: every record decodes as the core decodes it at
// restart, under the key of the entity it holds.
func checkRecordValues(c *checker) {
	kinds := map[string]int{}
	c.eachOf(liveBuckets, func(name, k, v []byte) {
		c.count("records", 1)
		key := string(k)
		if want := liveBucket(key); !bytes.Equal(want, name) {
			c.problem(core.Quote(key), "is in bucket %s, not %s", name, want)
		}
		kind, id, _ := strings.Cut(key, "/")
		if kind == core.KindRun && Sealed(v) { // secrets.go
			plain, err := c.keyed.keys.Open(key, v)
			if err != nil {
				c.problem(core.Quote(key), "is sealed and does not open: %v", err)
				return
			}
			v = plain
		}
		dec, err := core.DecodeRecord(core.Record{Key: key, Value: v})
		if err != nil {
			if knownKinds[kind] {
				c.problem(core.Quote(key), "does not decode: %v", err)
			} else {
				kinds[kind]++
			}
			return
		}
		want := id // the id the key should carry
		switch r := dec.(type) {
		case *core.RunRecord:
			c.runs[r.ID] = r
			want = string(r.ID)
		case *core.StepRecord:
			c.steps[r.ID] = r
			want = string(r.ID)
		case *core.LeaseRecord:
			c.leases[r.ID] = r
			want = fmt.Sprintf("%020d", uint64(r.ID))
		case *core.WorkerRecord:
			c.workers[r.ID] = r
			want = string(r.ID)
		case *core.TokenRecord:
			want = r.Name
		case *core.ScheduleRecord:
			want = r.Name
		case *core.StepLogLine:
			want = fmt.Sprintf("%020d/%010d", uint64(r.Lease), r.Index)
		case *core.RunHistory:
			c.archived[r.Run.ID] = true
			want = string(r.Run.ID)
		}
		if id != want {
			c.problem(core.Quote(key), "holds %s %s under another key", kind, core.Quote(want))
		}
	})
	for _, kind := range sortedKeys(kinds) {
		c.warn("kind "+core.Quote(kind), "%d records of a kind this check does not know: not checked", kinds[kind])
	}
	c.count("run", len(c.runs))
	c.count("step", len(c.steps))
	c.count("lease", len(c.leases))
	c.count("worker", len(c.workers))
}

func sortedKeys[K ~string | ~uint64, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// checkHistory: every history record decodes and holds the run its key
// names, finished; both indexes list it (the listing's summary says its
// status), list nothing else, and the count of archived runs is right.
func checkHistory(c *checker) {
	bySeq, byFinish := map[uint64]bool{}, map[string]bool{}
	c.each(bktHistory, func(k, v []byte) {
		id := core.RunID(k)
		where := "history/" + core.Quote(string(k))
		h, err := c.keyed.decodeHistory(id, v)
		if err != nil {
			c.problem(where, "does not decode: %v", err)
			return
		}
		if h.Run.ID != id {
			c.problem(where, "holds run %s", core.Quote(string(h.Run.ID)))
		}
		if !h.Run.Finished {
			c.problem(where, "holds a run that did not finish")
		}
		c.archived[id] = true
		for _, l := range h.Leases {
			c.archivedLeases[l.ID] = true
		}
		seq, ok := RunSeq(id)
		if !ok {
			c.problem(where, "names no run number")
			return
		}
		bySeq[seq] = true
		byFinish[string(finishKey(h.Run.FinishedAt, id))] = true
		var sum RunSummary
		if sv := c.tx.Bucket(bktRunsBySeq).Get(be64(seq)); sv == nil || json.Unmarshal(sv, &sum) != nil || sum.ID != id || sum.Status != h.Status {
			c.problem(where, "is missing from runs_by_seq, or listed there as another run or status")
		}
		if c.tx.Bucket(bktRunsByFinish).Get(finishKey(h.Run.FinishedAt, id)) == nil {
			c.problem(where, "is missing from runs_by_finish: retention would never prune it")
		}
	})
	c.each(bktRunsBySeq, func(k, _ []byte) {
		if len(k) != 8 || !bySeq[binary.BigEndian.Uint64(k)] {
			c.problem(fmt.Sprintf("runs_by_seq %x", k), "lists a run with no history")
		}
	})
	c.each(bktRunsByFinish, func(k, _ []byte) {
		if !byFinish[string(k)] {
			c.problem(fmt.Sprintf("runs_by_finish %x", k), "lists a run with no history")
		}
	})
	if b := c.tx.Bucket(bktHistoryStats); b != nil {
		if v := b.Get(statRuns); v != nil && (len(v) != 8 || int(binary.BigEndian.Uint64(v)) != len(c.archived)) {
			c.problem("history_stats", "counts %x archived runs, the history holds %d", v, len(c.archived))
		}
	}
	c.count("archived run", len(c.archived))
}

// checkLogs: every log line decodes under its own key and is a line of a
// live lease, of an archived run's, or of one the pruner noted (a run it is
// deleting); a pruning note is a list of lease ids.
func checkLogs(c *checker) {
	noted := map[core.LeaseID]bool{}
	c.each(bktPruning, func(k, v []byte) {
		if len(v)%8 != 0 {
			c.problem("pruning/"+core.Quote(string(k)), "malformed note (%d bytes)", len(v))
			return
		}
		for ; len(v) >= 8; v = v[8:] {
			noted[core.LeaseID(binary.BigEndian.Uint64(v))] = true
		}
	})
	c.each(bktLogs, func(k, v []byte) {
		c.count("log lines", 1)
		dec, err := core.DecodeRecord(core.Record{Key: string(k), Value: v})
		ln, ok := dec.(*core.StepLogLine)
		if err != nil || !ok {
			c.problem(core.Quote(string(k)), "does not decode as a log line: %v", err)
			return
		}
		if want := fmt.Sprintf("%s/%020d/%010d", core.KindLog, uint64(ln.Lease), ln.Index); string(k) != want {
			c.problem(core.Quote(string(k)), "holds the line of %s", core.Quote(want))
		}
		if c.leases[ln.Lease] == nil && !c.archivedLeases[ln.Lease] && !noted[ln.Lease] {
			c.problem(core.Quote(string(k)), "is a line of lease %d, which is neither live nor archived", ln.Lease)
		}
	})
}

// checkArchived: a run is live or archived, never both (SPEC §7a: one
// transaction deletes its live records and writes its history).
func checkArchived(c *checker) {
	for _, id := range sortedKeys(c.runs) {
		if c.archived[id] {
			c.problem("run/"+string(id), "is both live and archived (history/%s)", id)
		}
	}
	c.count("archived run", len(c.archived))
}

// checkRuns: a run's steps exist and belong to it.
func checkRuns(c *checker) {
	for _, id := range sortedKeys(c.runs) {
		for _, sid := range c.runs[id].Steps {
			switch s := c.steps[sid]; {
			case s == nil:
				c.problem("run/"+string(id), "lists step %s, which does not exist", core.Quote(string(sid)))
			case s.Run != id:
				c.problem("run/"+string(id), "lists step %s, which belongs to run %s", core.Quote(string(sid)), core.Quote(string(s.Run)))
			}
		}
	}
}

// checkSteps: a step's run exists and lists it; its dependencies exist;
// its current lease exists and is its.
func checkSteps(c *checker) {
	for _, id := range sortedKeys(c.steps) {
		s, where := c.steps[id], "step/"+string(id)
		r := c.runs[s.Run]
		switch {
		case r == nil:
			c.problem(where, "names run %s, which does not exist", core.Quote(string(s.Run)))
		case !slices.Contains(r.Steps, id):
			c.problem(where, "names run %s, which does not list it", core.Quote(string(s.Run)))
		}
		for _, d := range s.Deps {
			if c.steps[d] == nil {
				c.problem(where, "depends on step %s, which does not exist", core.Quote(string(d)))
			}
		}
		if s.Lease != 0 {
			switch l := c.leases[s.Lease]; {
			case l == nil:
				c.problem(where, "names lease %d, which does not exist", s.Lease)
			case l.Step != id:
				c.problem(where, "names lease %d, which is step %s's", s.Lease, core.Quote(string(l.Step)))
			}
		}
	}
}

// checkLeases: a current lease names an existing step, which names it
// back, and an existing worker.
func checkLeases(c *checker) {
	for _, id := range sortedKeys(c.leases) {
		l := c.leases[id]
		if !l.Current {
			continue
		}
		where := fmt.Sprintf("lease/%020d", uint64(id))
		switch s := c.steps[l.Step]; {
		case s == nil:
			c.problem(where, "is current for step %s, which does not exist", core.Quote(string(l.Step)))
		case s.Lease != id:
			c.problem(where, "is current, but its step %s names lease %d", core.Quote(string(l.Step)), s.Lease)
		}
		if c.workers[l.Worker] == nil {
			c.problem(where, "is current on worker %s, which does not exist", core.Quote(string(l.Worker)))
		}
	}
}

// splitIDKey splits "id 0x00 be64(n)".
func splitIDKey(k []byte) (string, uint64, bool) {
	i := bytes.IndexByte(k, 0)
	if i < 0 || len(k) != i+9 || ValidateID(string(k[:i])) != nil {
		return "", 0, false
	}
	return string(k[:i]), binary.BigEndian.Uint64(k[i+1:]), true
}

// namedOrChunked: the bytes of a version or a bundle are a blob the index
// names (of that size), or chunks of a store written before blobs.
func (c *checker) namedOrChunked(where, sha string, size int64, chunks []byte, prefix []byte) {
	if n, ok := c.blobs[sha]; ok {
		if n != size {
			c.problem(where, "is %d bytes, its blob %s %d", size, sha, n)
		}
		owner := append([]byte("b"), prefix...)
		if string(chunks) == string(bktDataChunk) {
			owner = append([]byte("d"), prefix...)
		}
		if b := c.tx.Bucket(bktBlobBy); b != nil && b.Get(blobByKey(sha, owner)) == nil {
			c.problem(where, "is missing from the reverse blob index (blob.by): pruning could take its blob")
		}
		return
	}
	if size == 0 {
		return
	}
	if b := c.tx.Bucket(chunks); b == nil || b.Get(chunkKey(prefix, 0)) == nil {
		c.problem(where, "names blob %s, which the blob index does not name, and has no chunks", sha)
	}
}

// loadBlobIndex reads the blob index once, for the data checks.
func (c *checker) loadBlobIndex() {
	if len(c.blobs) > 0 {
		return
	}
	c.each(bktBlob, func(k, v []byte) {
		if len(v) == 8 && ValidateFingerprint(string(k)) == nil {
			c.blobs[string(k)] = int64(binary.BigEndian.Uint64(v))
		}
	})
}

// checkData: every version decodes under its own key and its bytes exist.
func checkData(c *checker) {
	c.loadBlobIndex()
	c.each(bktData, func(k, v []byte) {
		c.count("data versions", 1)
		id, ver, ok := splitIDKey(k)
		where := fmt.Sprintf("data %q", k)
		if !ok {
			c.problem(where, "malformed key")
			return
		}
		where = fmt.Sprintf("data %s v%d", id, ver)
		var m DataMeta
		if err := json.Unmarshal(v, &m); err != nil {
			c.problem(where, "does not decode: %v", err)
			return
		}
		if m.ID != id || m.Version != ver || ver == 0 {
			c.problem(where, "holds version %d of %s", m.Version, core.Quote(m.ID))
		}
		if m.Deleted { // a tombstone has no bytes
			return
		}
		if ValidateFingerprint(m.SHA256) != nil {
			c.problem(where, "names no blob (sha256 %q)", m.SHA256)
			return
		}
		c.namedOrChunked(where, m.SHA256, m.Size, bktDataChunk, k)
	})
}

// checkStreams: a stream's appends lie end to end from offset 0 to its
// length, and every append belongs to a stream.
func checkStreams(c *checker) {
	type span struct{ next int64 }
	seen := map[string]*span{}
	c.each(bktStreamChunk, func(k, v []byte) {
		id, off, ok := splitIDKey(k)
		if !ok {
			c.problem(fmt.Sprintf("stream.chunk %q", k), "malformed key")
			return
		}
		sp := seen[id]
		if sp == nil {
			sp = &span{}
			seen[id] = sp
		}
		if int64(off) != sp.next {
			c.problem("stream "+id, "an append starts at %d, the one before ends at %d", off, sp.next)
		}
		sp.next = int64(off) + int64(len(v))
	})
	c.each(bktStream, func(k, v []byte) {
		c.count("streams", 1)
		id, where := string(k), "stream "+core.Quote(string(k))
		var m StreamMeta
		if err := json.Unmarshal(v, &m); err != nil {
			c.problem(where, "does not decode: %v", err)
			return
		}
		if m.ID != id {
			c.problem(where, "holds stream %s", core.Quote(m.ID))
		}
		var got int64
		if sp := seen[id]; sp != nil {
			got = sp.next
		}
		if got != m.Length {
			c.problem(where, "its length is %d, its appends hold %d bytes", m.Length, got)
		}
		delete(seen, id)
	})
	for _, id := range sortedKeys(seen) {
		c.problem("stream "+core.Quote(id), "has appends but no stream record")
	}
}

// checkBundles: a bundle decodes under its fingerprint, its bytes exist,
// and its file index lies inside it and counts what it says.
func checkBundles(c *checker) {
	c.loadBlobIndex()
	bundles := map[string]*BundleMeta{}
	c.each(bktBundle, func(k, v []byte) {
		c.count("bundles", 1)
		fp, where := string(k), "bundle "+core.Quote(string(k))
		var m BundleMeta
		if err := json.Unmarshal(v, &m); err != nil {
			c.problem(where, "does not decode: %v", err)
			return
		}
		if ValidateFingerprint(fp) != nil || m.Fingerprint != fp {
			c.problem(where, "holds bundle %s", core.Quote(m.Fingerprint))
			return
		}
		bundles[fp] = &m
		c.namedOrChunked(where, fp, m.Size, bktBundleChunk, k)
	})
	files := map[string]int{}
	c.each(bktBundleFile, func(k, v []byte) {
		fp, rel, ok := strings.Cut(string(k), "\x00")
		where := "bundle.file " + core.Quote(string(k))
		m := bundles[fp]
		switch {
		case !ok || ValidateRelPath(rel) != nil || len(v) != 16:
			c.problem(where, "malformed entry")
		case m == nil:
			c.problem(where, "indexes a file of bundle %s, which does not exist", core.Quote(fp))
		case !m.Tar:
			c.problem(where, "indexes a file of bundle %s, which is not a tar", fp)
		default:
			off, size := int64(binary.BigEndian.Uint64(v)), int64(binary.BigEndian.Uint64(v[8:]))
			if off < 0 || size < 0 || off+size > m.Size {
				c.problem(where, "lies at %d+%d, outside the bundle's %d bytes", off, size, m.Size)
			}
			files[fp]++
		}
	})
	for _, fp := range sortedKeys(bundles) {
		if m := bundles[fp]; m.Tar && files[fp] != m.Files {
			c.problem("bundle "+fp, "says %d files, its index holds %d", m.Files, files[fp])
		}
	}
}

// checkBlobIndex: every entry of the blob index is well formed.
func checkBlobIndex(c *checker) {
	c.each(bktBlob, func(k, v []byte) {
		c.count("blobs named", 1)
		if len(v) != 8 || ValidateFingerprint(string(k)) != nil {
			c.problem(fmt.Sprintf("blob %q", k), "malformed index entry")
		}
	})
	c.loadBlobIndex()
}

// checkBlobBy: every entry of the reverse blob index names a record that
// names that blob, and every blob it lists is in the blob index (the
// pruner unnames a blob by it: a stale entry would keep a blob forever, a
// missing one would let it go while named).
func checkBlobBy(c *checker) {
	c.each(bktBlobBy, func(k, _ []byte) {
		c.count("blob owners", 1)
		i := bytes.IndexByte(k, 0)
		if i < 0 || i+1 >= len(k) {
			c.problem(fmt.Sprintf("blob.by %q", k), "malformed entry")
			return
		}
		sha, owner := string(k[:i]), k[i+1:]
		where := fmt.Sprintf("blob.by %s", sha)
		if _, ok := c.blobs[sha]; !ok {
			c.problem(where, "lists a blob the index does not name")
		}
		switch owner[0] {
		case 'd':
			var m DataMeta
			v := c.tx.Bucket(bktData).Get(owner[1:])
			if v == nil || json.Unmarshal(v, &m) != nil || m.SHA256 != sha {
				c.problem(where, "names a data version that does not name it")
			}
		case 'b':
			if string(owner[1:]) != sha || c.tx.Bucket(bktBundle).Get(owner[1:]) == nil {
				c.problem(where, "names a bundle that does not exist or is another")
			}
		default:
			c.problem(where, "names an owner of unknown kind %q", owner[:1])
		}
	})
}

// checkBlobFiles: every blob the index names is a file of its size in the
// blob directory; a file nobody names is a warning (the next start
// collects it).
func checkBlobFiles(c *checker) {
	ents, err := os.ReadDir(c.blobDir)
	if err != nil && !os.IsNotExist(err) {
		c.problem(c.blobDir, "cannot be read: %v", err)
		return
	}
	onDisk := map[string]bool{}
	for _, e := range ents {
		name := e.Name()
		c.count("blob files", 1)
		switch {
		case strings.HasPrefix(name, blobTempPrefix):
			c.warn("blob file "+core.Quote(name), "a write that never finished; the next start removes it")
			continue
		case ValidateFingerprint(name) != nil:
			c.warn("blob file "+core.Quote(name), "not a blob: nothing reads it")
			continue
		}
		onDisk[name] = true
		if _, ok := c.blobs[name]; !ok {
			c.warn("blob "+name, "no record names it; the next start removes it")
		}
	}
	for _, sha := range sortedKeys(c.blobs) {
		if !onDisk[sha] {
			c.problem("blob "+sha, "named by the index but missing from %s", c.blobDir)
			continue
		}
		st, err := os.Stat(c.blobDir + "/" + sha)
		switch {
		case err != nil:
			c.problem("blob "+sha, "%v", err)
		case st.Size() != c.blobs[sha]:
			c.problem("blob "+sha, "holds %d bytes, the index says %d", st.Size(), c.blobs[sha])
		}
	}
}

// checkRequests: every remembered answer decodes, and the counts of
// request.count are the entries' (SPEC §14, idempotent writes).
func checkRequests(c *checker) {
	per := map[uint64]uint64{}
	var total uint64
	c.each(bktRequest, func(k, v []byte) {
		c.count("request ids", 1)
		var e RequestEntry
		if len(k) <= 8 || json.Unmarshal(v, &e) != nil {
			c.problem(fmt.Sprintf("request %q", k), "malformed")
			return
		}
		per[binary.BigEndian.Uint64(k[:8])]++
		total++
	})
	c.each(bktRequestCount, func(k, v []byte) {
		switch {
		case bytes.Equal(k, totalKey):
			if count(v) != total {
				c.problem("request.count total", "says %d, the store holds %d", count(v), total)
			}
		case len(k) == 8:
			if l := binary.BigEndian.Uint64(k); count(v) != per[l] {
				c.problem(fmt.Sprintf("request.count lease %d", l), "says %d, the store holds %d", count(v), per[l])
			}
		default:
			c.problem(fmt.Sprintf("request.count %q", k), "malformed key")
		}
	})
}
