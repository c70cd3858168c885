package zkstore

import "github.com/flightlock/flightlock/lockstore"

// The middleware finds a store's name and response store through Describer, at run time.
var _ lockstore.Describer = (*Store)(nil)

// Describe implements lockstore.Describer: the store as "zookeeper" and its inspector, for
// keys under prefix. It keeps no responses (Responses nil), and closing it ends its session,
// and with it every hold (CloseEndsHolds).
func (s *Store) Describe(prefix string) *lockstore.Backend {
	return &lockstore.Backend{Name: "zookeeper", Store: s, Prefix: prefix, Inspector: NewInspector(s, prefix), CloseEndsHolds: true}
}
