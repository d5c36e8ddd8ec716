package store

// Retention (SPEC §7a, §12): a pruner deletes what is older than the
// retention and kept by nothing live, in transactions of a bounded number
// of deletions each, so that it never holds the driver's commits for more
// than a few milliseconds. This file holds the data plane's part:
//
//   - a data version created before the cutoff, unless it is its id's newest
//     (what "latest" names, which a live run may read);
//   - a stream last appended before the cutoff, with its chunks;
//   - a bundle uploaded before the cutoff, unless the caller says a live run
//     names it.
//
// A blob leaves the blob index when the last record naming it goes, in the
// same transaction, and is then collected (blob.go): the reverse index
// blob.by (sha256 0x00 owner → nothing) says who names it, so the question
// costs one seek.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// bktBlobBy is the reverse blob index: sha256 0x00 owner → nothing, where
// owner is "d" + a data version's key or "b" + a bundle's fingerprint.
var bktBlobBy = []byte("blob.by")

func blobByKey(sha string, owner []byte) []byte {
	k := make([]byte, 0, len(sha)+1+len(owner))
	k = append(k, sha...)
	k = append(k, 0)
	return append(k, owner...)
}

func dataOwner(id string, v uint64) []byte { return append([]byte("d"), versionKey(id, v)...) }
func bundleOwner(fp string) []byte         { return append([]byte("b"), fp...) }

// ensureBlobBy creates the reverse blob index, filling it from the data
// and bundle records on the first open of a store written before it.
func ensureBlobBy(tx *bolt.Tx) error {
	if tx.Bucket(bktBlobBy) != nil {
		return nil
	}
	by, err := tx.CreateBucket(bktBlobBy)
	if err != nil {
		return fmt.Errorf("bucket %s: %w", bktBlobBy, err)
	}
	err = tx.Bucket(bktData).ForEach(func(k, v []byte) error {
		var m DataMeta
		if json.Unmarshal(v, &m) != nil || m.SHA256 == "" || tx.Bucket(bktBlob).Get([]byte(m.SHA256)) == nil {
			return nil // a version from before blobs (its bytes are chunks), or not one: no blob
		}
		return by.Put(blobByKey(m.SHA256, append([]byte("d"), k...)), nil)
	})
	if err != nil {
		return err
	}
	return tx.Bucket(bktBundle).ForEach(func(k, _ []byte) error {
		if tx.Bucket(bktBlob).Get(k) == nil {
			return nil // a bundle from before blobs
		}
		return by.Put(blobByKey(string(k), bundleOwner(string(k))), nil)
	})
}

// unnameBlob removes owner's naming of a blob; once nothing names it, it
// leaves the blob index and is returned to be collected.
func unnameBlob(tx *bolt.Tx, sha string, owner []byte) (orphan bool, err error) {
	by := tx.Bucket(bktBlobBy)
	if err := by.Delete(blobByKey(sha, owner)); err != nil {
		return false, err
	}
	prefix := append([]byte(sha), 0)
	if k, _ := by.Cursor().Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) {
		return false, nil // another record names it
	}
	if tx.Bucket(bktBlob).Get([]byte(sha)) == nil {
		return false, nil
	}
	return true, tx.Bucket(bktBlob).Delete([]byte(sha))
}

// PruneBudget is how many deletions one pruning transaction makes at most.
const PruneBudget = 2000

// PruneStats counts what a pruning pass deleted.
type PruneStats struct {
	Versions, Streams, Bundles, Runs, LogLines, Blobs int
	Audit                                             int // audit entries (audit.go)
	Transactions                                      int
}

// Add sums two passes' counts.
func (p *PruneStats) Add(q PruneStats) {
	p.Versions += q.Versions
	p.Streams += q.Streams
	p.Bundles += q.Bundles
	p.Runs += q.Runs
	p.LogLines += q.LogLines
	p.Blobs += q.Blobs
	p.Audit += q.Audit
	p.Transactions += q.Transactions
}

// pruneTx is one pruning transaction's budget and tally.
type pruneTx struct {
	PruneStats
	left    int      // deletions this transaction may still make
	orphans []string // blobs that left the index
}

func (p *pruneTx) spend(n int) bool {
	if p.left < n {
		return false
	}
	p.left -= n
	return true
}

// pruneStep is one kind of deletion, resumable: it works from *from (nil:
// the start), leaves it past what it examined, and says whether more is left.
type pruneStep func(tx *bolt.Tx, p *pruneTx, from *[]byte) (more bool, err error)

// PruneData deletes the data plane's records older than cutoff that nothing
// keeps (see the top of this file), at most budget deletions per
// transaction. keepBundle says whether a live run names a bundle; nil keeps
// none. The blobs they alone named are collected afterwards.
func (s *Store) PruneData(cutoff time.Time, keepBundle func(fp string) bool, budget int) (PruneStats, error) {
	if keepBundle == nil {
		keepBundle = func(string) bool { return false }
	}
	cutoff = cutoff.UTC()
	return s.prune(budget, []pruneStep{
		func(tx *bolt.Tx, p *pruneTx, from *[]byte) (bool, error) { return pruneVersions(tx, p, from, cutoff) },
		func(tx *bolt.Tx, p *pruneTx, from *[]byte) (bool, error) { return pruneStreams(tx, p, from, cutoff) },
		func(tx *bolt.Tx, p *pruneTx, from *[]byte) (bool, error) { return pruneRequests(tx, p, from, cutoff) },
		func(tx *bolt.Tx, p *pruneTx, from *[]byte) (bool, error) {
			return pruneOrphans(tx, p, from, bktStreamChunk, bktStream)
		},
		func(tx *bolt.Tx, p *pruneTx, from *[]byte) (bool, error) {
			return pruneBundles(tx, p, from, cutoff, keepBundle)
		},
		func(tx *bolt.Tx, p *pruneTx, from *[]byte) (bool, error) {
			return pruneOrphans(tx, p, from, bktBundleFile, bktBundle)
		},
		func(tx *bolt.Tx, p *pruneTx, from *[]byte) (bool, error) {
			return pruneOrphans(tx, p, from, bktBundleChunk, bktBundle)
		},
	})
}

// prune runs each step to its end, one bounded transaction at a time.
func (s *Store) prune(budget int, steps []pruneStep) (PruneStats, error) {
	if budget <= 0 {
		budget = PruneBudget
	}
	var st PruneStats
	for _, step := range steps {
		var from []byte
		for more := true; more; {
			p := &pruneTx{left: budget}
			err := s.update(func(tx *bolt.Tx) error {
				var err error
				more, err = step(tx, p, &from)
				return err
			})
			if err != nil {
				return st, fmt.Errorf("store: prune: %w", s.mapErr(err))
			}
			p.Transactions = 1
			st.Add(p.PruneStats)
			st.Blobs += len(p.orphans)
			s.release(p.orphans)
		}
	}
	return st, nil
}

// pick scans bucket from *from (nil: its start) and returns, up to p's
// budget, the entries go says are to be deleted (copies: they outlive the
// cursor), leaving *from at the first entry it did not examine when the
// budget stopped it.
func pick(tx *bolt.Tx, bucket []byte, p *pruneTx, from *[]byte, goes func(k, v []byte) bool) (victims [][2][]byte, more bool) {
	c := tx.Bucket(bucket).Cursor()
	k, v := c.First()
	if *from != nil {
		k, v = c.Seek(*from)
	}
	for ; k != nil; k, v = c.Next() {
		if len(victims) >= p.left {
			*from = append([]byte(nil), k...)
			return victims, true
		}
		if goes(k, v) {
			victims = append(victims, [2][]byte{append([]byte(nil), k...), append([]byte(nil), v...)})
		}
	}
	return victims, false
}

// unname removes owner's naming of a blob, and collects the blob if that
// was the last (unnameBlob).
func (p *pruneTx) unname(tx *bolt.Tx, sha string, owner []byte) error {
	orphan, err := unnameBlob(tx, sha, owner)
	if orphan {
		p.orphans = append(p.orphans, sha)
	}
	return err
}

// pruneVersions deletes the versions created before cutoff that are not
// their id's newest.
func pruneVersions(tx *bolt.Tx, p *pruneTx, from *[]byte, cutoff time.Time) (bool, error) {
	victims, more := pick(tx, bktData, p, from, func(k, v []byte) bool {
		var m DataMeta
		if len(k) < 9 || json.Unmarshal(v, &m) != nil || !m.Created.Before(cutoff) {
			return false
		}
		newest, err := latestVersion(tx, m.ID)
		return err == nil && newest.Version > m.Version // the newest is what "latest" names
	})
	for _, kv := range victims {
		if err := tx.Bucket(bktData).Delete(kv[0]); err != nil {
			return false, err
		}
		p.spend(1)
		p.Versions++
		if err := deletePrefix(tx.Bucket(bktDataChunk), kv[0]); err != nil { // a version from before blobs
			return false, err
		}
		var m DataMeta
		if json.Unmarshal(kv[1], &m) == nil && m.SHA256 != "" {
			if err := p.unname(tx, m.SHA256, append([]byte("d"), kv[0]...)); err != nil {
				return false, err
			}
		}
	}
	return more, nil
}

// pruneStreams deletes the streams last appended before cutoff; their
// chunks go after (pruneOrphans).
func pruneStreams(tx *bolt.Tx, p *pruneTx, from *[]byte, cutoff time.Time) (bool, error) {
	victims, more := pick(tx, bktStream, p, from, func(_, v []byte) bool {
		var m StreamMeta
		return json.Unmarshal(v, &m) == nil && m.Updated.Before(cutoff)
	})
	for _, kv := range victims {
		if err := tx.Bucket(bktStream).Delete(kv[0]); err != nil {
			return false, err
		}
		p.spend(1)
		p.Streams++
	}
	return more, nil
}

// pruneBundles deletes the bundles uploaded before cutoff that no live run
// names; their file index and chunks go after (pruneOrphans).
func pruneBundles(tx *bolt.Tx, p *pruneTx, from *[]byte, cutoff time.Time, keep func(string) bool) (bool, error) {
	victims, more := pick(tx, bktBundle, p, from, func(k, v []byte) bool {
		var m BundleMeta
		return json.Unmarshal(v, &m) == nil && m.Created.Before(cutoff) && !keep(string(k))
	})
	for _, kv := range victims {
		fp := string(kv[0])
		if err := tx.Bucket(bktBundle).Delete(kv[0]); err != nil {
			return false, err
		}
		p.spend(1)
		p.Bundles++
		if err := p.unname(tx, fp, bundleOwner(fp)); err != nil {
			return false, err
		}
	}
	return more, nil
}

// pruneOrphans deletes the entries of a child bucket (keys "owner 0x00 …",
// or an owner's 64-hex fingerprint followed by a chunk number) whose owner
// is no longer in the parent bucket: what a deleted stream or bundle left.
// It visits each owner once (a seek past its entries when it is alive).
func pruneOrphans(tx *bolt.Tx, p *pruneTx, from *[]byte, child, parent []byte) (bool, error) {
	cb, pb := tx.Bucket(child), tx.Bucket(parent)
	c := cb.Cursor()
	k, _ := c.First()
	if *from != nil {
		k, _ = c.Seek(*from)
	}
	for k != nil {
		owner := ownerOf(k, string(child) == string(bktBundleChunk))
		if pb.Get(owner) != nil {
			k, _ = c.Seek(append(append([]byte(nil), owner...), 0xff)) // past this owner's entries
			continue
		}
		if !p.spend(1) {
			*from = append([]byte(nil), k...)
			return true, nil
		}
		k = append([]byte(nil), k...)
		if err := cb.Delete(k); err != nil {
			return false, err
		}
		k, _ = c.Seek(k) // the cursor's position after a delete is not reliable: seek again
	}
	return false, nil
}

// ownerOf is the owner part of a child key: up to its first 0x00 (an id
// or a fingerprint has none), or, in bundle.chunk (fingerprint be32(n)),
// the 64-hex fingerprint.
func ownerOf(k []byte, fingerprinted bool) []byte {
	if fingerprinted {
		return k[:min(len(k), 64)]
	}
	if i := bytes.IndexByte(k, 0); i >= 0 {
		return k[:i]
	}
	return k
}

// deletePrefix deletes every key of b starting with prefix.
func deletePrefix(b *bolt.Bucket, prefix []byte) error {
	var keys [][]byte
	c := b.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		keys = append(keys, append([]byte(nil), k...))
	}
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// release hands blobs that left the index to the collector.
func (s *Store) release(shas []string) {
	if len(shas) == 0 {
		return
	}
	s.blobMu.Lock()
	defer s.blobMu.Unlock()
	for _, sha := range shas {
		s.unsure[sha] = true
	}
	s.collectLocked()
}
