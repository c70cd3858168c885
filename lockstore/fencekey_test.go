package lockstore

import "testing"

func TestFenceKeySameSlot(t *testing.T) {
	if crc16("123456789") != 0x31c3 {
		t.Fatalf("crc16 check value = %#x, want 0x31c3", crc16("123456789"))
	}
	if keySlot("foo") != 12182 || keySlot("{user1000}.following") != keySlot("user1000") {
		t.Fatal("keySlot disagrees with Redis Cluster's specification examples")
	}
	for _, k := range []string{"lock:a", "lock:{u1}:x", "a}b", "}{", "{}x}", "x{}y}", "\xff}", "{a"} {
		if fk := FenceKey(k); keySlot(fk) != keySlot(k) || fk == k {
			t.Errorf("FenceKey(%q) = %q in slot %d, lock in slot %d", k, fk, keySlot(fk), keySlot(k))
		}
	}
}

func FuzzFenceKeySameSlot(f *testing.F) {
	for _, s := range []string{"a", "}", "{a}b", "a}{b}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, k string) {
		if keySlot(FenceKey(k)) != keySlot(k) {
			t.Fatalf("FenceKey(%q) in another slot", k)
		}
	})
}
