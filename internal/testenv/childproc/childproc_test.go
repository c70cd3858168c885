package childproc

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// middleEnv makes the test binary the middle process of TestChildDiesWithItsParent: it starts
// a tied grandchild (sleep), prints its pid and waits to be killed.
const middleEnv = "CHILDPROC_MIDDLE"

func TestMain(m *testing.M) {
	if os.Getenv(middleEnv) != "" {
		os.Exit(middle())
	}
	os.Exit(m.Run())
}

func middle() int {
	cmd := exec.Command("sleep", "60")
	Tie(cmd)
	if err := cmd.Start(); err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println(cmd.Process.Pid)
	time.Sleep(time.Minute) // killed by the test
	return 0
}

// alive reports whether pid runs (a zombie nobody reaped yet does not count).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // the command name may hold spaces
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// A process started with Tie dies when the process that started it is SIGKILLed, as a test
// binary that go test kills at its -timeout: it would otherwise live on.
func TestChildDiesWithItsParent(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("childproc ties children to their parent on Linux only")
	}
	if _, err := exec.LookPath("sleep"); err != nil {
		t.Skip("no sleep binary")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), middleEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("middle process: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("middle process printed %q", line)
	}
	t.Cleanup(func() {
		if alive(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL) // the grandchild this test started
		}
	})
	if !alive(pid) {
		t.Fatalf("grandchild %d is not running", pid)
	}
	_ = cmd.Process.Kill() // SIGKILL: the middle process runs no clean-up
	_ = cmd.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("grandchild %d still runs 5s after its parent was killed", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
