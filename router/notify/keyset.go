package notify

import "container/list"

// keySet is a set of at most size keys; adding to a full set forgets the least recently
// added or looked-up key.
type keySet struct {
	size  int
	order *list.List // front: most recent
	index map[string]*list.Element
}

func newKeySet(size int) *keySet {
	return &keySet{size: size, order: list.New(), index: make(map[string]*list.Element, size)}
}

func (s *keySet) contains(k string) bool {
	e, ok := s.index[k]
	if ok {
		s.order.MoveToFront(e)
	}
	return ok
}

func (s *keySet) add(k string) {
	if e, ok := s.index[k]; ok {
		s.order.MoveToFront(e)
		return
	}
	s.index[k] = s.order.PushFront(k)
	if s.order.Len() > s.size {
		oldest := s.order.Back()
		s.order.Remove(oldest)
		delete(s.index, oldest.Value.(string))
	}
}
