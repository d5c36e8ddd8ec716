package store

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// rssFile is this process's resident pages of mapped files (RssFile).
func rssFile(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "RssFile:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("/proc/self/status has no RssFile")
	return 0
}

// TestReleaseMapped reads 32 MiB of a store through bbolt's map, which
// makes them resident, and checks ReleaseMapped gives them back.
func TestReleaseMapped(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const total, size = 32 << 20, 64 << 10
	val := make([]byte, size)
	for i := range val {
		val[i] = byte(i * 7)
	}
	err = s.update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("release-test"))
		if err != nil {
			return err
		}
		for i := 0; i < total/size; i++ {
			if err := b.Put([]byte(fmt.Sprintf("%08d", i)), val); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	before := rssFile(t)
	sum := 0
	err = s.view(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("release-test")).ForEach(func(k, v []byte) error {
			for i := 0; i < len(v); i += 1024 {
				sum += int(v[i])
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	read := rssFile(t)
	if read-before < total*3/4 {
		t.Fatalf("reading %d MiB through the map made only %d KiB resident: the test measures nothing", total>>20, (read-before)>>10)
	}
	if err := s.ReleaseMapped(); err != nil {
		t.Fatal(err)
	}
	after := rssFile(t)
	if after-before > total/8 {
		t.Fatalf("after ReleaseMapped %d KiB of the %d MiB read are still resident (RssFile %d → %d → %d KiB)",
			(after-before)>>10, total>>20, before>>10, read>>10, after>>10)
	}
	// Released pages read again are the same bytes.
	again := 0
	s.view(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("release-test")).ForEach(func(k, v []byte) error {
			for i := 0; i < len(v); i += 1024 {
				again += int(v[i])
			}
			return nil
		})
	})
	if again != sum {
		t.Fatalf("the pages read back after the release differ: sum %d, was %d", again, sum)
	}
}
