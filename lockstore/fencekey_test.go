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
