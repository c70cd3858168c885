// Package fencedsql writes SQL rows only for the current holder of their lock, through
// go-zero's sqlx: an UPDATE carries the fence of the writer's lease (flightlock.Lease.Fence)
// and changes the row only if the row's lock_fence column is not larger, storing the fence.
// A holder that stalled until its lock went to someone else gets ErrStaleFence instead of
// overwriting the newer holder's row. It is package fenced's guard for a database.
//
// Add the column once (MySQL, MariaDB, TiDB):
//
//	ALTER TABLE account ADD COLUMN lock_fence BIGINT NOT NULL DEFAULT 0;
//
// and write through Update, with the conn of a go-zero model (sqlx.SqlConn) or the session of
// a transaction:
//
//	_, err := fencedsql.Update(ctx, conn, lease.Fence(), "`account`",
//		"`balance` = `balance` - ?", []any{amount}, "`id` = ?", id)
package fencedsql

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"

	"github.com/zeromicro/go-zero/core/stores/sqlx"

	"github.com/flightlock/flightlock/fenced"
)

// Column is the column that holds the largest fence that wrote a row.
const Column = "lock_fence"

// ErrStaleFence is fenced.ErrStaleFence: the row was written under a newer lock (unchanged).
var ErrStaleFence = fenced.ErrStaleFence

// tableName accepts plain and quoted (`x`, schema.table) identifiers: the table is written
// into the statement, so it must not carry SQL of its own.
var tableName = regexp.MustCompile("^(`[^`]+`|[A-Za-z_][A-Za-z0-9_$]*)(\\.(`[^`]+`|[A-Za-z_][A-Za-z0-9_$]*))?$")

// Update runs
//
//	UPDATE table SET <set>, lock_fence = ? WHERE (<where>) AND lock_fence <= ?
//
// with setArgs, fence, whereArgs and fence, and returns the rows it changed. When it changed
// none it finds out why, with one more query: no row matches where (sqlx.ErrNotFound), or the
// row was written with a larger fence (ErrStaleFence); a row that matched with a fence not
// larger, but already held the values, is not an error. session is a go-zero sqlx.SqlConn or
// the Session of a transaction (conn.TransactCtx).
func Update(ctx context.Context, session sqlx.Session, fence int64, table, set string, setArgs []any,
	where string, whereArgs ...any) (int64, error) {
	if !tableName.MatchString(table) {
		return 0, fmt.Errorf("fencedsql: %q is not a table name", table)
	}
	if set == "" || where == "" {
		return 0, errors.New("fencedsql: Update needs a SET list and a WHERE condition")
	}
	query := fmt.Sprintf("UPDATE %s SET %s, `%s` = ? WHERE (%s) AND `%s` <= ?", table, set, Column, where, Column)
	res, err := session.ExecCtx(ctx, query, slices.Concat(setArgs, []any{fence}, whereArgs, []any{fence})...)
	if err != nil {
		return 0, fmt.Errorf("fencedsql: update %s: %w", table, err)
	}
	n, err := res.RowsAffected()
	if err != nil || n > 0 {
		return n, err
	}
	var probe struct {
		Rows  int64 `db:"n"`
		Fence int64 `db:"f"`
	}
	err = session.QueryRowCtx(ctx, &probe,
		fmt.Sprintf("SELECT COUNT(*) AS n, COALESCE(MAX(`%s`), 0) AS f FROM %s WHERE (%s)", Column, table, where), whereArgs...)
	switch {
	case err != nil:
		return 0, fmt.Errorf("fencedsql: update %s: read %s: %w", table, Column, err)
	case probe.Rows == 0:
		return 0, fmt.Errorf("fencedsql: update %s: %w", table, sqlx.ErrNotFound)
	case probe.Fence > fence:
		return 0, fmt.Errorf("%w: %s was written with fence %d, this write has %d", ErrStaleFence, table, probe.Fence, fence)
	}
	return 0, nil
}
