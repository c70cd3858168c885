package fencedsql_test

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/core/stores/sqlx"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/fenced/fencedsql"
	"github.com/flightlock/flightlock/internal/testenv/mariadbtest"
	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore/redisstore"
)

// As a go-zero model user runs it: a table with a lock_fence column, written through
// sqlx.SqlConn under flightlock leases on a real Redis. A holder that stalls until a newer
// holder wrote the row is refused, and the newer write stands; in a transaction too.
func TestStaleWriterIsRefusedOnMariaDB(t *testing.T) {
	logx.Disable()
	db := mariadbtest.Start(t, "shop")
	conn := sqlx.NewMysql(db.DSN("shop"))
	ctx := context.Background()
	for _, q := range []string{
		"CREATE TABLE `account` (`id` VARCHAR(32) PRIMARY KEY, `balance` BIGINT NOT NULL)",
		// The migration the README gives:
		"ALTER TABLE account ADD COLUMN lock_fence BIGINT NOT NULL DEFAULT 0",
		"INSERT INTO `account` (`id`, `balance`) VALUES ('a1', 1000)",
	} {
		if _, err := conn.ExecCtx(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	srv := redistest.Start(t)
	store := redisstore.New(redis.NewClient(srv.Options()))
	defer store.Close()
	first, _ := flightlock.New(store, flightlock.WithPrefix("lock:"))
	second, _ := flightlock.New(store, flightlock.WithPrefix("lock:"))

	debit := func(fence, amount int64) error {
		_, err := fencedsql.Update(ctx, conn, fence, "`account`", "`balance` = `balance` - ?", []any{amount}, "`id` = ?", "a1")
		return err
	}
	lease1, err := first.Lock(ctx, "acct:a1")
	if err != nil {
		t.Fatal(err)
	}
	if err := debit(lease1.Fence(), 100); err != nil {
		t.Fatal(err)
	}
	// The first holder stalls past its TTL (its key goes), the second takes the lock and
	// writes twice, in a transaction and outside one.
	srv.Client().Del(ctx, "lock:acct:a1")
	lease2, err := second.Lock(ctx, "acct:a1")
	if err != nil {
		t.Fatal(err)
	}
	defer lease2.Release(ctx)
	if err := conn.TransactCtx(ctx, func(ctx context.Context, s sqlx.Session) error {
		_, err := fencedsql.Update(ctx, s, lease2.Fence(), "account", "balance = balance - ?", []any{200}, "id = ?", "a1")
		return err
	}); err != nil {
		t.Fatalf("the current holder's write in a transaction: %v", err)
	}
	if err := debit(lease2.Fence(), 50); err != nil {
		t.Fatalf("the current holder's second write: %v", err)
	}
	// The first holder resumes.
	if err := debit(lease1.Fence(), 100); !errors.Is(err, fencedsql.ErrStaleFence) {
		t.Fatalf("the stale holder's write: %v, want ErrStaleFence", err)
	}
	var row struct {
		Balance int64 `db:"balance"`
		Fence   int64 `db:"lock_fence"`
	}
	if err := conn.QueryRowCtx(ctx, &row, "SELECT balance, lock_fence FROM account WHERE id = ?", "a1"); err != nil {
		t.Fatal(err)
	}
	if row.Balance != 650 || row.Fence != lease2.Fence() {
		t.Errorf("row: balance %d fence %d, want 650 (1000-100-200-50) and the current holder's fence %d", row.Balance, row.Fence, lease2.Fence())
	}

	// A write that changes nothing is not an error; a missing row is sqlx.ErrNotFound; a
	// table name with SQL in it is refused.
	if _, err := fencedsql.Update(ctx, conn, lease2.Fence(), "account", "balance = ?", []any{650}, "id = ?", "a1"); err != nil {
		t.Errorf("an update to the same values: %v", err)
	}
	if _, err := fencedsql.Update(ctx, conn, lease2.Fence(), "account", "balance = 0", nil, "id = ?", "nobody"); !errors.Is(err, sqlx.ErrNotFound) {
		t.Errorf("update of a missing row: %v, want sqlx.ErrNotFound", err)
	}
	if _, err := fencedsql.Update(ctx, conn, lease2.Fence(), "account; DROP TABLE account", "balance = 0", nil, "1=1"); err == nil {
		t.Error("a table name with SQL in it was accepted")
	}
	_ = lease1.Release(ctx)
}
