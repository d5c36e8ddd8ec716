package worker

// The worker's read cache (SPEC §10): the bytes of data versions its steps
// read through the step endpoint, by (id, version). A numbered version is
// immutable (SPEC §14), so a cached copy is that version's bytes for as
// long as the orchestrator serves it; `latest` is never cached (it moves).
// The cache is bounded in bytes and evicts the least recently used version.
// Bytes enter only when their SHA-256 is the one the orchestrator announced,
// and are checked again each time they are served: a cache never serves
// bytes the orchestrator did not.

import (
	"container/list"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"sync"
)

// DefaultCacheBytes is the read cache's default bound (worker connect
// --cache-size).
const DefaultCacheBytes = 256 << 20

type cacheKey struct {
	id      string
	version uint64
}

type cacheEntry struct {
	key    cacheKey
	b      []byte
	sha256 string      // hex, as the orchestrator announced it
	header http.Header // the answer's forwarded headers
}

// readCache is safe for concurrent use.
type readCache struct {
	mu    sync.Mutex
	max   int64
	used  int64
	order *list.List // of *cacheEntry, most recently used first
	byKey map[cacheKey]*list.Element

	hits, misses uint64
}

// newReadCache returns a cache of at most max bytes; nil (no cache) for
// max ≤ 0.
func newReadCache(max int64) *readCache {
	if max <= 0 {
		return nil
	}
	return &readCache{max: max, order: list.New(), byKey: map[cacheKey]*list.Element{}}
}

// fits says whether a version of size bytes can be cached at all.
func (c *readCache) fits(size int64) bool { return c != nil && size >= 0 && size <= c.max }

// get returns the cached version, checked against its SHA-256 (a copy that
// fails the check is dropped and reported as a miss).
func (c *readCache) get(k cacheKey) (*cacheEntry, bool) {
	if c == nil {
		return nil, false
	}
	c.mu.Lock()
	el, ok := c.byKey[k]
	if !ok {
		c.misses++
		c.mu.Unlock()
		return nil, false
	}
	c.order.MoveToFront(el)
	e := el.Value.(*cacheEntry)
	c.mu.Unlock()
	if sum := sha256.Sum256(e.b); hex.EncodeToString(sum[:]) != e.sha256 {
		c.mu.Lock()
		c.drop(k)
		c.misses++
		c.mu.Unlock()
		return nil, false
	}
	c.mu.Lock()
	c.hits++
	c.mu.Unlock()
	return e, true
}

// put caches b as version k if its SHA-256 is sha (hex) and it fits,
// evicting the least recently used versions to make room.
func (c *readCache) put(k cacheKey, b []byte, sha string, header http.Header) bool {
	if c == nil || !c.fits(int64(len(b))) {
		return false
	}
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != sha {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.byKey[k]; ok {
		return true
	}
	for c.used+int64(len(b)) > c.max {
		last := c.order.Back()
		c.drop(last.Value.(*cacheEntry).key)
	}
	c.byKey[k] = c.order.PushFront(&cacheEntry{key: k, b: b, sha256: sha, header: header})
	c.used += int64(len(b))
	return true
}

// drop removes k (c.mu held).
func (c *readCache) drop(k cacheKey) {
	if el, ok := c.byKey[k]; ok {
		c.used -= int64(len(el.Value.(*cacheEntry).b))
		c.order.Remove(el)
		delete(c.byKey, k)
	}
}

// size returns the bytes cached and the number of versions.
func (c *readCache) size() (bytes int64, versions int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used, len(c.byKey)
}
