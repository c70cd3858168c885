package lockstore

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
)

func TestFenceKeySameSlot(t *testing.T) {
	if crc16("123456789") != 0x31c3 {
		t.Fatalf("crc16 check value = %#x, want 0x31c3", crc16("123456789"))
	}
	if KeySlot("foo") != 12182 || KeySlot("{user1000}.following") != KeySlot("user1000") {
		t.Fatal("KeySlot disagrees with Redis Cluster's specification examples")
	}
	for _, k := range []string{"lock:a", "lock:{u1}:x", "a}b", "}{", "{}x}", "x{}y}", "\xff}", "{a"} {
		if fk := FenceKey(k); KeySlot(fk) != KeySlot(k) || fk == k {
			t.Errorf("FenceKey(%q) = %q in slot %d, lock in slot %d", k, fk, KeySlot(fk), KeySlot(k))
		}
	}
}

func FuzzFenceKeySameSlot(f *testing.F) {
	for _, s := range []string{"a", "}", "{a}b", "a}{b}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, k string) {
		if KeySlot(FenceKey(k)) != KeySlot(k) {
			t.Fatalf("FenceKey(%q) in another slot", k)
		}
	})
}

func TestSideKeysShareTheLockKeysSlotAndNeverCollide(t *testing.T) {
	keys := []string{"lock:order:1", "lock:{tenant-7}:export", "lock:a}b", "lock:a{}b{c}", "lock:{", "lock:}{x}", "", "lock:order:1:r"}
	keys = append(keys, "{"+SideKey("readers", "lock:order:1")[len(FenceKeyPrefix+"readers#{"):]) // a tagged key shaped like an untagged one's side key
	seen := map[string]string{}
	for _, k := range keys {
		for _, kind := range []string{"readers", "line"} {
			side := SideKey(kind, k)
			if got, want := KeySlot(side), KeySlot(k); got != want {
				t.Errorf("SideKey(%q, %q) = %q is in slot %d, the lock key in %d", kind, k, side, got, want)
			}
			if !strings.HasPrefix(side, FenceKeyPrefix) {
				t.Errorf("SideKey(%q, %q) = %q is not under %q", kind, k, side, FenceKeyPrefix)
			}
			if prev, dup := seen[side]; dup {
				t.Errorf("SideKey(%q, %q) = %q, as for %s", kind, k, side, prev)
			}
			seen[side] = kind + " " + k
		}
	}
}

// Naming the fence counters of every hash slot keeps nothing live: a process that locked keys
// of all 16,384 slots keeps no name per slot, which a measurement of its first locks would
// count as memory per lock that releasing them does not give back.
func TestNamingEverySlotsCounterKeepsNoHeap(t *testing.T) {
	keys := make([]string, 0, 16384)
	for s := range uint16(16384) {
		keys = append(keys, "{"+strconv.FormatUint(uint64(slotTag(s)), 10)+"}")
	}
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	var sink string
	for _, k := range keys {
		sink = FenceKey(k)
	}
	grown := int64(heap()) - int64(before)
	runtime.KeepAlive(keys)
	if grown > 32<<10 {
		t.Fatalf("naming the counters of 16,384 slots left %d bytes live (last name %q)", grown, sink)
	}
}

// A semaphore's permits live in its key's hash slot whenever Redis Cluster lets them (the key
// has a hash tag, or no "{" at all), so that one script call looks at them all; and no permit
// key of one key is a lock key or a permit key of another, for keys whose "#" are doubled.
func TestPermitKeysShareTheKeysSlotAndNeverCollide(t *testing.T) {
	keys := []string{"lock:export:acme", "lock:{tenant-7}:export", "lock:a}b", "lock:x##y", "lock:x##", "lock:",
		"lock:{x}", "lock:x", "{lock:x}", "lock:{", "lock:a{}b", "lock:}{x}"}
	keys = append(keys, PermitKey("lock:x", 2)[:len("lock:x#")-1]+"##"+PermitKey("lock:x", 2)[len("lock:x#"):]) // looks like x's permit 2, "#" doubled
	seen := map[string]string{}
	for _, k := range keys {
		all := PermitKeys(k, 4)
		for i := 1; i <= 4; i++ {
			p := PermitKey(k, i)
			if all[i-1] != p {
				t.Errorf("PermitKeys(%q, 4)[%d] = %q, PermitKey says %q", k, i-1, all[i-1], p)
			}
			if prev, dup := seen[p]; dup {
				t.Errorf("PermitKey(%q, %d) = %q, as for %s", k, i, p, prev)
			}
			seen[p] = k + " #" + strconv.Itoa(i)
			_, tagged := hashTag(k)
			if shares := tagged || !strings.Contains(k, "{"); shares && KeySlot(p) != KeySlot(k) {
				t.Errorf("PermitKey(%q, %d) = %q is in slot %d, the key in %d", k, i, p, KeySlot(p), KeySlot(k))
			}
			if i == 1 && p != k {
				t.Errorf("PermitKey(%q, 1) = %q, want the key itself", k, p)
			}
		}
	}
}

func FuzzPermitKeySharesTheSlot(f *testing.F) {
	for _, s := range []string{"a", "}", "{a}b", "a}{b}", "a{"} {
		f.Add(s, 2)
	}
	f.Fuzz(func(t *testing.T, k string, i int) {
		if i < 2 || i > 64 || strings.Contains(k, "{") {
			if _, tagged := hashTag(k); !tagged || i < 2 || i > 64 {
				return
			}
		}
		if KeySlot(PermitKey(k, i)) != KeySlot(k) {
			t.Fatalf("PermitKey(%q, %d) = %q in another slot", k, i, PermitKey(k, i))
		}
	})
}
