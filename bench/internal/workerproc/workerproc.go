// Package workerproc starts the worker processes of the benchmarks' multi-process scenarios
// (lockbench and hotkey re-execute themselves as workers): the parent writes the common start
// time to a worker's standard input and reads its READY line and its result from its standard
// output.
package workerproc

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"

	"github.com/flightlock/flightlock/internal/testenv/childproc"
)

// proc is a started worker.
type proc struct {
	Cmd   *exec.Cmd
	Stdin io.WriteCloser
	Out   *bufio.Reader
}

// start starts cmd (its standard error goes to this process's) with pipes to its standard
// input and output.
func start(cmd *exec.Cmd) (*proc, error) {
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("worker stdin: %w", err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("worker stdout: %w", err)
	}
	childproc.Tie(cmd) // a worker dies with the benchmark, however it ends
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start worker: %w", err)
	}
	return &proc{Cmd: cmd, Stdin: in, Out: bufio.NewReader(out)}, nil
}
