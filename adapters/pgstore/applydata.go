package pgstore

// ApplyWithData in three round trips whatever the number of ops: the fence
// and the records (one pgx.Batch); then everything the ops read — the
// newest version of each id they put or delete, each stream they append
// to (locked), the bundles already there, their request ids' entries and
// the counts of their leases — in one more; then the ops are decided in
// order in memory, as the bbolt store decides them inside its transaction,
// and their writes go in one last batch, multi-row per table. One process
// writes the data plane (the leader); within it, dataMu keeps calls from
// deciding on the same reads.

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/core"
)

type reqKey struct {
	lease uint64
	id    string
}

// dataTx is one call's reads and the writes it decided.
type dataTx struct {
	s        *Store
	latest   map[string]store.DataMeta // newest version per id (absent: none)
	streams  map[string]store.StreamMeta
	bundles  map[string]store.BundleMeta
	requests map[reqKey]store.RequestEntry
	counts   map[uint64]int64 // remembered answers per lease; 0: the total

	versions     []store.DataMeta
	chunkIDs     []string
	chunkOffs    []int64
	chunkBodies  [][]byte
	streamsDirty map[string]bool
	newBundles   []store.BundleMeta
	files        struct {
		fps, paths  []string
		offs, sizes []int64
	}
	secrets     map[string][]byte // sealed value; nil: delete
	secretOrder []string
	newRequests []reqKey
	countsDirty map[uint64]int64
	newEntries  map[reqKey][]byte
}

// ApplyWithData is Apply plus data-plane writes, all in one fenced
// transaction: the records and every accepted op, or nothing. A refused op
// (its DataResult.Err) writes nothing and does not abort the rest.
func (s *Store) ApplyWithData(recs []core.Record, ops []store.DataOp) ([]store.DataResult, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if err := checkRecords(recs); err != nil {
		return nil, err
	}
	for i, op := range ops {
		if err := s.checkOp(op); err != nil {
			return nil, fmt.Errorf("pgstore: data op %d of %d: %w", i+1, len(ops), err)
		}
	}
	var jops []jop
	var batch []byte
	if len(recs) > 0 {
		var err error
		if jops, batch, err = s.prepare(recs); err != nil {
			return nil, err
		}
		if err := s.admit(); err != nil {
			return nil, err
		}
	}
	s.dataMu.Lock()
	defer s.dataMu.Unlock()
	var res []store.DataResult
	var seq int64
	if len(recs) > 0 {
		seq = s.reserveSeq()
	}
	// The records go to the journal in the transaction of the ops (no fold
	// awaited: the ops read only the data plane's tables).
	err := s.tx(false, func(ctx context.Context, tx pgx.Tx) error {
		if len(recs) > 0 {
			if _, err := tx.Exec(ctx, journalInsert, seq, batch); err != nil {
				return err
			}
		}
		if len(ops) == 0 {
			res = []store.DataResult{}
			return nil
		}
		d := &dataTx{s: s}
		if err := d.read(ctx, tx, ops); err != nil {
			return err
		}
		res = make([]store.DataResult, len(ops))
		for i, op := range ops {
			var err error
			res[i], err = d.apply(op)
			if isRefusal(err) {
				res[i].Err, err = err, nil
			}
			if err != nil {
				return err
			}
		}
		return d.flush(ctx, tx)
	})
	if len(recs) > 0 {
		s.committed(seq, jops, len(batch), err)
	}
	if err != nil {
		return nil, fmt.Errorf("pgstore: apply %d records and %d data ops: %w", len(recs), len(ops), err)
	}
	return res, nil
}

// read loads, in one round trip, everything the ops read.
func (d *dataTx) read(ctx context.Context, tx pgx.Tx, ops []store.DataOp) error {
	d.latest, d.streams, d.bundles = map[string]store.DataMeta{}, map[string]store.StreamMeta{}, map[string]store.BundleMeta{}
	d.requests, d.counts = map[reqKey]store.RequestEntry{}, map[uint64]int64{}
	d.streamsDirty, d.secrets, d.countsDirty, d.newEntries = map[string]bool{}, map[string][]byte{}, map[uint64]int64{}, map[reqKey][]byte{}
	var ids, streams, fps, reqIDs []string
	var reqLeases []int64
	leases := []int64{0}
	for _, op := range ops {
		switch op.Kind {
		case store.OpPut, store.OpDelete:
			ids = append(ids, op.ID)
		case store.OpAppend:
			streams = append(streams, op.ID)
		case store.OpBundle:
			fps = append(fps, op.Blob.SHA256)
		}
		if op.Request != "" {
			reqLeases, reqIDs = append(reqLeases, int64(op.Lease)), append(reqIDs, op.Request)
			leases = append(leases, int64(op.Lease))
		}
	}
	b := &pgx.Batch{}
	decode := func(into func(k string, v []byte) error) func(pgx.Rows) error {
		return func(rows pgx.Rows) error {
			for rows.Next() {
				var k string
				var v []byte
				if err := rows.Scan(&k, &v); err != nil {
					return err
				}
				if err := into(k, v); err != nil {
					return err
				}
			}
			return rows.Err()
		}
	}
	if len(ids) > 0 {
		b.Queue("SELECT DISTINCT ON (id) id, meta FROM tether_data WHERE id = ANY($1::text[]) ORDER BY id, version DESC", ids).Query(
			decode(func(k string, v []byte) error {
				m := store.DataMeta{}
				err := json.Unmarshal(v, &m)
				d.latest[k] = m
				return err
			}))
	}
	if len(streams) > 0 {
		// FOR UPDATE: the appends' offsets are decided on these lengths.
		b.Queue("SELECT id, meta FROM tether_stream WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE", streams).Query(
			decode(func(k string, v []byte) error {
				m := store.StreamMeta{}
				err := json.Unmarshal(v, &m)
				d.streams[k] = m
				return err
			}))
	}
	if len(fps) > 0 {
		b.Queue("SELECT fp, meta FROM tether_bundle WHERE fp = ANY($1::text[])", fps).Query(
			decode(func(k string, v []byte) error {
				m := store.BundleMeta{}
				err := json.Unmarshal(v, &m)
				d.bundles[k] = m
				return err
			}))
	}
	if len(reqIDs) > 0 {
		b.Queue(`SELECT r.lease, r.id, r.entry FROM tether_request r JOIN unnest($1::bigint[], $2::text[]) AS q(lease, id)
			ON r.lease = q.lease AND r.id = q.id`, reqLeases, reqIDs).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var lease int64
				var id string
				var v []byte
				if err := rows.Scan(&lease, &id, &v); err != nil {
					return err
				}
				var e store.RequestEntry
				if err := json.Unmarshal(v, &e); err != nil {
					return fmt.Errorf("request %q of lease %d: %w", id, lease, err)
				}
				d.requests[reqKey{uint64(lease), id}] = e
			}
			return rows.Err()
		})
		b.Queue("SELECT lease, n FROM tether_request_count WHERE lease = ANY($1::bigint[])", leases).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var lease, n int64
				if err := rows.Scan(&lease, &n); err != nil {
					return err
				}
				d.counts[uint64(lease)] = n
			}
			return rows.Err()
		})
	}
	if b.Len() == 0 {
		return nil
	}
	return tx.SendBatch(ctx, b).Close()
}

// apply decides one op on what the call read and decided before it.
func (d *dataTx) apply(op store.DataOp) (store.DataResult, error) {
	var r store.DataResult
	k := reqKey{op.Lease, op.Request}
	if op.Request != "" {
		if e, ok := d.requests[k]; ok {
			if e.Kind != op.Kind || e.ID != op.ID {
				return r, fmt.Errorf("%w: request %q of lease %d was for %s", store.ErrRequestReused, op.Request, op.Lease, describe(e))
			}
			return e.Result(), nil
		}
		if op.RepeatOnly {
			return r, fmt.Errorf("%w: request %q of lease %d; send it again", store.ErrRequestLost, op.Request, op.Lease)
		}
		switch n, total := d.counts[op.Lease], d.counts[0]; {
		case n >= store.MaxRequestsPerLease:
			return r, fmt.Errorf("%w: lease %d has %d, at most %d (nothing was written)", store.ErrRequestsFull, op.Lease, n, store.MaxRequestsPerLease)
		case total >= store.MaxRequests:
			return r, fmt.Errorf("%w: the store holds %d, at most %d until retention removes old ones (nothing was written)", store.ErrRequestsFull, total, store.MaxRequests)
		}
	}
	switch op.Kind {
	case store.OpPut:
		if err := d.s.pinned(op.Blob); err != nil {
			return r, err
		}
		r.Data = store.DataMeta{
			ID: op.ID, Version: d.latest[op.ID].Version + 1, Size: op.Blob.Size, SHA256: op.Blob.SHA256,
			Created: op.At.UTC(), Worker: op.Worker, Lease: op.Lease, Run: op.Run, Step: op.Step,
			Attributes: op.Attributes,
		}
		d.latest[op.ID] = r.Data
		d.versions = append(d.versions, r.Data)
	case store.OpDelete:
		latest, ok := d.latest[op.ID]
		switch {
		case !ok:
			return r, fmt.Errorf("%w: data %q has no version to delete", store.ErrNotFound, op.ID)
		case latest.Deleted:
			return r, fmt.Errorf("%w: data %q is already deleted (version %d)", store.ErrNotFound, op.ID, latest.Version)
		}
		r.Data = store.DataMeta{
			ID: op.ID, Version: latest.Version + 1, Created: op.At.UTC(), Worker: op.Worker, Lease: op.Lease,
			Run: op.Run, Step: op.Step, Deleted: true,
		}
		d.latest[op.ID] = r.Data
		d.versions = append(d.versions, r.Data)
	case store.OpAppend:
		m := d.streams[op.ID]
		size := int64(len(op.Body))
		if op.MaxStream > 0 && m.Length+size > op.MaxStream {
			return r, fmt.Errorf("%w: stream %q holds %d bytes, %d more would pass %d", store.ErrStreamFull, op.ID, m.Length, size, op.MaxStream)
		}
		r.Append = store.AppendResult{ID: op.ID, Offset: m.Length, Size: size, Length: m.Length + size}
		d.streams[op.ID] = store.StreamMeta{ID: op.ID, Length: r.Append.Length, Appends: m.Appends + 1, Updated: op.At.UTC()}
		d.streamsDirty[op.ID] = true
		d.chunkIDs, d.chunkOffs, d.chunkBodies = append(d.chunkIDs, op.ID), append(d.chunkOffs, r.Append.Offset), append(d.chunkBodies, op.Body)
	case store.OpBundle:
		fp := op.Blob.SHA256
		if m, ok := d.bundles[fp]; ok {
			m.Existed = true
			r.Bundle = m
			break
		}
		if err := d.s.pinned(op.Blob); err != nil {
			return r, err
		}
		r.Bundle = store.BundleMeta{Fingerprint: fp, Size: op.Blob.Size, Created: op.At.UTC(), Tar: op.Files != nil, Files: len(op.Files)}
		d.bundles[fp] = r.Bundle
		d.newBundles = append(d.newBundles, r.Bundle)
		paths := make([]string, 0, len(op.Files))
		for p := range op.Files {
			paths = append(paths, p)
		}
		sort.Strings(paths)
		for _, p := range paths {
			d.files.fps, d.files.paths = append(d.files.fps, fp), append(d.files.paths, p)
			d.files.offs, d.files.sizes = append(d.files.offs, op.Files[p].Offset), append(d.files.sizes, op.Files[p].Size)
		}
	case store.OpSecretPut:
		v, err := d.s.keys.Seal(op.ID, op.Body)
		if err != nil {
			return r, err
		}
		d.secret(op.ID, v)
	case store.OpSecretDelete:
		d.secret(op.ID, nil)
	}
	if op.Request != "" {
		e := store.RequestEntry{Worker: op.Worker, Kind: op.Kind, ID: op.ID, At: op.At.UTC()}
		switch op.Kind {
		case store.OpPut, store.OpDelete:
			e.Data = &r.Data
		case store.OpAppend:
			e.Append = &r.Append
		}
		enc, err := json.Marshal(e)
		if err != nil {
			return r, err
		}
		d.requests[k] = e
		d.newEntries[k] = enc
		d.newRequests = append(d.newRequests, k)
		d.counts[op.Lease]++
		d.counts[0]++
		d.countsDirty[op.Lease]++
		d.countsDirty[0]++
	}
	return r, nil
}

func (d *dataTx) secret(name string, v []byte) {
	if _, ok := d.secrets[name]; !ok {
		d.secretOrder = append(d.secretOrder, name)
	}
	d.secrets[name] = v
}

// flush sends the writes the ops decided, in one batch.
func (d *dataTx) flush(ctx context.Context, tx pgx.Tx) error {
	b := &pgx.Batch{}
	if n := len(d.versions); n > 0 {
		ids, vers, created, shas, metas := make([]string, n), make([]int64, n), make([]int64, n), make([]*string, n), make([][]byte, n)
		for i, m := range d.versions {
			enc, err := json.Marshal(m)
			if err != nil {
				return err
			}
			ids[i], vers[i], created[i], metas[i] = m.ID, int64(m.Version), nanos(m.Created), enc
			if m.SHA256 != "" {
				shas[i] = &d.versions[i].SHA256
			}
		}
		b.Queue(`INSERT INTO tether_data (id, version, created_ns, sha, meta)
			SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::bytea[])`, ids, vers, created, shas, metas)
	}
	if len(d.chunkIDs) > 0 {
		b.Queue("INSERT INTO tether_stream_chunk (id, off, bytes) SELECT * FROM unnest($1::text[], $2::bigint[], $3::bytea[])",
			d.chunkIDs, d.chunkOffs, d.chunkBodies)
		var ids []string
		var updated []int64
		var metas [][]byte
		for _, id := range sortedKeys(d.streamsDirty) {
			m := d.streams[id]
			enc, err := json.Marshal(m)
			if err != nil {
				return err
			}
			ids, updated, metas = append(ids, id), append(updated, nanos(m.Updated)), append(metas, enc)
		}
		b.Queue(`INSERT INTO tether_stream (id, updated_ns, meta) SELECT * FROM unnest($1::text[], $2::bigint[], $3::bytea[])
			ON CONFLICT (id) DO UPDATE SET updated_ns = excluded.updated_ns, meta = excluded.meta`, ids, updated, metas)
	}
	if n := len(d.newBundles); n > 0 {
		fps, created, metas := make([]string, n), make([]int64, n), make([][]byte, n)
		for i, m := range d.newBundles {
			enc, err := json.Marshal(m)
			if err != nil {
				return err
			}
			fps[i], created[i], metas[i] = m.Fingerprint, nanos(m.Created), enc
		}
		b.Queue("INSERT INTO tether_bundle (fp, created_ns, meta) SELECT * FROM unnest($1::text[], $2::bigint[], $3::bytea[])", fps, created, metas)
		if len(d.files.fps) > 0 {
			b.Queue("INSERT INTO tether_bundle_file (fp, path, off, size) SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[])",
				d.files.fps, d.files.paths, d.files.offs, d.files.sizes)
		}
	}
	var putNames, delNames []string
	var putValues [][]byte
	for _, name := range d.secretOrder {
		if v := d.secrets[name]; v != nil {
			putNames, putValues = append(putNames, name), append(putValues, v)
		} else {
			delNames = append(delNames, name)
		}
	}
	if len(putNames) > 0 {
		b.Queue(`INSERT INTO tether_secret (name, value) SELECT * FROM unnest($1::text[], $2::bytea[])
			ON CONFLICT (name) DO UPDATE SET value = excluded.value`, putNames, putValues)
	}
	if len(delNames) > 0 {
		b.Queue("DELETE FROM tether_secret WHERE name = ANY($1::text[])", delNames)
	}
	if n := len(d.newRequests); n > 0 {
		leases, ids, ats, entries := make([]int64, n), make([]string, n), make([]int64, n), make([][]byte, n)
		for i, k := range d.newRequests {
			leases[i], ids[i], ats[i], entries[i] = int64(k.lease), k.id, nanos(d.requests[k].At), d.newEntries[k]
		}
		b.Queue("INSERT INTO tether_request (lease, id, at_ns, entry) SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::bytea[])",
			leases, ids, ats, entries)
		// In lease order (the total, 0, first), as PruneData locks them.
		var cl, cn []int64
		for _, lease := range sortedKeys(d.countsDirty) {
			cl, cn = append(cl, int64(lease)), append(cn, d.countsDirty[lease])
		}
		b.Queue(`INSERT INTO tether_request_count (lease, n) SELECT * FROM unnest($1::bigint[], $2::bigint[])
			ON CONFLICT (lease) DO UPDATE SET n = tether_request_count.n + excluded.n`, cl, cn)
	}
	if b.Len() == 0 {
		return nil
	}
	return tx.SendBatch(ctx, b).Close()
}

func describe(e store.RequestEntry) string {
	switch e.Kind {
	case store.OpPut:
		return "a put of " + strconv.Quote(e.ID)
	case store.OpAppend:
		return "an append to " + strconv.Quote(e.ID)
	case store.OpDelete:
		return "a delete of " + strconv.Quote(e.ID)
	}
	return "another write"
}

func sortedKeys[K string | uint64, V any](m map[K]V) []K {
	ks := make([]K, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
	return ks
}
