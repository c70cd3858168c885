// Package mariadbtest starts a real MariaDB server for integration tests, in a temporary data
// directory on a free loopback port, and ends it by pid when the test ends.
//
// When the server binaries are missing the test is skipped with a message, except under
// CI=true, where they are required (.ci/run installs mariadb-server).
package mariadbtest

import (
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/flightlock/flightlock/internal/testenv/childproc"
	"github.com/flightlock/flightlock/internal/testenv/freeport"
	_ "github.com/go-sql-driver/mysql" // the driver go-zero's sqlx.NewMysql uses
)

// Server is a mariadbd process owned by one test.
type Server struct {
	Addr string // 127.0.0.1:port
	cmd  *exec.Cmd
}

// DSN is the go-sql-driver data source name of database db on the server (as root, which the
// test server lets in without a password: it runs with --skip-grant-tables).
func (s *Server) DSN(db string) string {
	return "root@tcp(" + s.Addr + ")/" + db + "?parseTime=true"
}

func binary(tb testing.TB, names ...string) string {
	tb.Helper()
	for _, n := range names {
		for _, dir := range []string{"", "/usr/sbin/", "/usr/bin/"} {
			if p, err := exec.LookPath(dir + n); err == nil {
				return p
			}
		}
	}
	if os.Getenv("CI") == "true" {
		tb.Fatalf("%s is required under CI=true but was not found (apt-get install mariadb-server)", names[0])
	}
	tb.Skipf("%s not installed (apt-get install mariadb-server); skipping MariaDB test", names[0])
	return ""
}

// Start initializes a data directory, runs mariadbd on a free loopback port, creates database
// db and stops the server when tb ends.
func Start(tb testing.TB, db string) *Server {
	tb.Helper()
	server := binary(tb, "mariadbd", "mysqld")
	install := binary(tb, "mariadb-install-db", "mysql_install_db")
	dir := tb.TempDir()
	data := filepath.Join(dir, "data")
	out, err := exec.Command(install, "--no-defaults", "--datadir="+data, "--user=root",
		"--auth-root-authentication-method=normal", "--skip-test-db").CombinedOutput()
	if err != nil {
		tb.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	addr := freeport.Addr(tb)
	_, portText, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(portText)
	s := &Server{Addr: addr}
	s.cmd = exec.Command(server, "--no-defaults", "--datadir="+data, "--port="+strconv.Itoa(port),
		"--bind-address=127.0.0.1", "--socket="+filepath.Join(dir, "sock"), "--pid-file="+filepath.Join(dir, "pid"),
		"--log-error="+filepath.Join(dir, "error.log"), "--user=root", "--skip-grant-tables", "--skip-log-bin",
		"--innodb-buffer-pool-size=32M")
	childproc.Tie(s.cmd)
	if err := s.cmd.Start(); err != nil {
		tb.Fatalf("start mariadbd: %v", err)
	}
	tb.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	})

	conn, err := sql.Open("mysql", s.DSN(""))
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err = conn.Ping(); err == nil {
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			tb.Fatalf("mariadbd on %s did not answer: %v\n%s", s.Addr, err, log)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := conn.Exec(fmt.Sprintf("CREATE DATABASE `%s`", db)); err != nil {
		tb.Fatalf("create database %s: %v", db, err)
	}
	return s
}
