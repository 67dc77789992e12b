package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pinned-go/pinned/loadgen"
)

// machineTicks returns busy and total CPU ticks of all cores so far
// (/proc/stat; busy is everything but idle and iowait).
func machineTicks() (busy, total uint64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, errors.New("/proc/stat: no cpu line")
	}
	for i, s := range f[1:] {
		if i >= 8 { // guest times are already in user/nice
			break
		}
		v, _ := strconv.ParseUint(s, 10, 64)
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total, nil
}

// busyFraction samples /proc/stat over d and returns the fraction of CPU
// time (all cores) that was not idle or iowait.
func busyFraction(ctx context.Context, d time.Duration) (float64, error) {
	read := machineTicks
	b0, t0, err := read()
	if err != nil {
		return 0, err
	}
	select {
	case <-time.After(d):
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	b1, t1, err := read()
	if err != nil {
		return 0, err
	}
	if t1 == t0 {
		return 0, nil
	}
	return float64(b1-b0) / float64(t1-t0), nil
}

// perfStat counts syscalls and context switches of a set of pids while it
// runs (perf stat from linux-perf; tracepoint counting).
type perfStat struct {
	cmd  *exec.Cmd
	out  string
	done chan error
}

// perfEvents are the counted events; both are software events that work
// without hardware counters (in VMs and containers).
const perfEvents = "raw_syscalls:sys_enter,context-switches"

// startPerf starts perf stat on pids; nil (and no error) when perf is
// missing or refused, so the caller reports "n/a".
func startPerf(dir string, pids []int) (*perfStat, error) {
	bin, err := exec.LookPath("perf")
	if err != nil {
		return nil, nil
	}
	ps := make([]string, len(pids))
	for i, p := range pids {
		ps[i] = strconv.Itoa(p)
	}
	f, err := os.CreateTemp(dir, "perf-*.csv")
	if err != nil {
		return nil, err
	}
	f.Close()
	p := &perfStat{out: f.Name(), done: make(chan error, 1)}
	p.cmd = exec.Command(bin, "stat", "-x", ",", "-e", perfEvents, "-p", strings.Join(ps, ","), "-o", p.out)
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		return nil, nil
	}
	go func() { p.done <- p.cmd.Wait() }() // owned by p: stop waits for it
	// perf attaches asynchronously; give it a moment so the counting
	// window covers the load (the load run is seconds long).
	time.Sleep(100 * time.Millisecond)
	return p, nil
}

// stop ends the count (SIGINT makes perf print its totals) and returns
// syscalls and context switches; ok is false when perf could not count.
func (p *perfStat) stop() (syscalls, cswitches float64, ok bool) {
	if p == nil {
		return 0, 0, false
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return 0, 0, false
	}
	b, err := os.ReadFile(p.out)
	os.Remove(p.out)
	if err != nil {
		return 0, 0, false
	}
	return parsePerf(string(b))
}

// parsePerf reads perf stat -x, output: value,unit,event,...
func parsePerf(out string) (syscalls, cswitches float64, ok bool) {
	var nsys, ncs = -1.0, -1.0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, ",")
		if len(f) < 3 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue // "<not counted>", "<not supported>"
		}
		switch {
		case strings.HasPrefix(f[2], "raw_syscalls:sys_enter"):
			nsys = v
		case strings.HasPrefix(f[2], "context-switches"):
			ncs = v
		}
	}
	if nsys < 0 || ncs < 0 {
		return 0, 0, false
	}
	return nsys, ncs, true
}

// runLoadgen runs the loadgen binary (pinned to the generator's CPUs) with
// args plus a JSON report, and returns the report and the generator's CPU
// seconds.
func (r *rig) runLoadgen(ctx context.Context, label string, args ...string) (*loadgen.Report, float64, error) {
	out := filepath.Join(r.dir, "loadgen-"+label+".json")
	// The suites judge errors themselves (the overload workload wants 503s):
	// loadgen's error budget would fail their runs.
	args = append(args, "-quiet", "-json", out, "-label", label, "-max-errors", "off")
	bin, full := pinned(r.o.PinGen, r.bins.loadgen, args...)
	cmd := exec.CommandContext(ctx, bin, full...)
	msg, err := cmd.CombinedOutput()
	if err != nil {
		return nil, 0, fmt.Errorf("loadgen %s: %v\n%s", strings.Join(args, " "), err, tail(msg, 2000))
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return nil, 0, err
	}
	os.Remove(out)
	var rep loadgen.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, 0, fmt.Errorf("loadgen JSON: %w", err)
	}
	cpu := 0.0
	if st := cmd.ProcessState; st != nil {
		cpu = (st.UserTime() + st.SystemTime()).Seconds()
	}
	return &rep, cpu, nil
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// cpuWindow snapshots the CPU ticks of a set of processes.
type cpuWindow map[*proc]int64

func snapshotCPU(ps ...*proc) cpuWindow {
	w := cpuWindow{}
	for _, p := range ps {
		if p == nil {
			continue
		}
		var t int64
		for _, pid := range p.pids {
			v, _ := cpuTicks(pid)
			t += v
		}
		w[p] = t
	}
	return w
}

// since returns each process's CPU seconds since w.
func (w cpuWindow) since() map[*proc]float64 {
	now := snapshotCPU(keys(w)...)
	out := map[*proc]float64{}
	for p, t := range w {
		out[p] = float64(now[p]-t) / clkTck
	}
	return out
}

func keys(w cpuWindow) []*proc {
	out := make([]*proc, 0, len(w))
	for p := range w {
		out = append(out, p)
	}
	return out
}

// machineInfo describes the machine and the versions of everything run.
func machineInfo() [][2]string {
	cpu := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	var uts syscall.Utsname
	kernel := "?"
	if syscall.Uname(&uts) == nil {
		kernel = cstr(uts.Release[:])
	}
	mem := "?"
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		l, _, _ := strings.Cut(string(b), "\n")
		mem = strings.Join(strings.Fields(l)[1:], " ")
	}
	ver := func(name string, args ...string) string {
		p, err := exec.LookPath(name)
		if err != nil {
			if p, err = exec.LookPath("/usr/sbin/" + name); err != nil {
				return "not installed"
			}
		}
		out, _ := exec.Command(p, args...).CombinedOutput()
		l, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		return l
	}
	gover := ver("go", "version")
	return [][2]string{
		{"CPU", fmt.Sprintf("%s × %d (runtime.NumCPU)", cpu, runtime.NumCPU())},
		{"memory", mem},
		{"kernel", kernel},
		{"Go", gover},
		{"redis-server", ver("redis-server", "--version")},
		{"nginx", ver("nginx", "-v")},
		{"HAProxy", ver("haproxy", "-v")},
		{"wrk", ver("wrk", "-v")},
		{"perf", ver("perf", "--version")},
	}
}

func cstr(b []int8) string {
	var s []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

// installMissing installs the named programs (nginx, haproxy, wrk: each
// package installs the binary of its name) from the distribution's
// packages when missing (root only), without letting the packages start
// their services: a policy-rc.d that refuses every start is in place
// during the install.
func installMissing(log func(string, ...any), names ...string) error {
	var missing []string
	for _, b := range names {
		if _, err := exec.LookPath(b); err != nil {
			if _, err := os.Stat("/usr/sbin/" + b); err != nil {
				missing = append(missing, b)
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("%v missing and not root: apt-get install %s", missing, strings.Join(missing, " "))
	}
	log("installing %v from the distribution's packages", missing)
	const policy = "/usr/sbin/policy-rc.d"
	if _, err := os.Stat(policy); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile(policy, []byte("#!/bin/sh\nexit 101\n"), 0o755); err == nil {
			defer os.Remove(policy)
		}
	}
	env := append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	for _, args := range [][]string{{"update", "-qq"}, append([]string{"install", "-y", "-qq", "--no-install-recommends"}, missing...)} {
		cmd := exec.Command("apt-get", args...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get %s: %v\n%s", strings.Join(args, " "), err, tail(out, 2000))
		}
	}
	return nil
}
