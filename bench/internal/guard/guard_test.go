package guard

import "testing"

func TestReadWriteCountsAWriterBesideReaders(t *testing.T) {
	cases := []struct {
		name  string
		enter func(g Guard)
	}{
		{"writer after a reader", func(g Guard) { g.EnterRead(); g.Enter(0) }},
		{"reader after a writer", func(g Guard) { g.Enter(0); g.EnterRead() }},
		{"two writers", func(g Guard) { g.Enter(0); g.Enter(0) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := New().ReadWrite()
			tc.enter(g)
			if got := g.Violations(); got != 1 {
				t.Fatalf("violations = %d, want 1", got)
			}
		})
	}
}

func TestReadWriteLetsReadersShare(t *testing.T) {
	g := New().ReadWrite()
	for range 3 {
		g.EnterRead()
	}
	g.Read()
	if got := g.Violations(); got != 0 {
		t.Fatalf("violations = %d, want 0", got)
	}
	if got := g.Peak(); got != 4 {
		t.Fatalf("peak = %d, want 4", got)
	}
	for range 3 {
		g.ExitRead()
	}
	g.Critical(0)
	if got, plain := g.Violations(), g.Plain(); got != 0 || plain != 1 {
		t.Fatalf("after the readers left: violations = %d, plain = %d, want 0 and 1", got, plain)
	}
}
