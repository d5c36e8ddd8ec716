package pgstore

// PlacesKept counts the pipeline's places reachable from the last one
// reserved (the tests' view of its memory).
func PlacesKept(s *Store) int {
	s.orderMu.Lock()
	defer s.orderMu.Unlock()
	n := 0
	for p := s.last; p != nil; p = p.prev {
		n++
	}
	return n
}
