package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/klauspost/compress/zstd"
	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/latency"
	"github.com/torpor-dev/torpor/internal/netns"
	"github.com/torpor-dev/torpor/internal/node"
	"github.com/torpor-dev/torpor/internal/runtime"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
)

// The big actors of issue 17: about 200 MB of state each.
const (
	// bigRedisKeys values of bigRedisValueSize bytes: 200 MB of values,
	// ~230 MB of Redis memory.
	bigRedisKeys      = 200_000
	bigRedisValueSize = 1000
	// bigPythonEntries dict entries make ~205 MB of Python memory.
	bigPythonEntries = 560_000
)

// BenchmarkBigRedisWorker: a Redis actor holding ~200 MB (bigRedisKeys
// generated values, see redisValue), on one node with two workers. Each
// iteration suspends it (FULL, to snapshot storage) and resumes it on the
// node's other worker (the one it left is held by another actor), then
// checks its keys. Interleaved baseline: plain runsc checkpoint and
// restore of a Redis sandbox filled alike, beside the agent's workers.
//
//	go test ./e2e -run '^$' -bench BigRedis -benchtime=5x -count=1 -timeout 30m
func BenchmarkBigRedisWorker(b *testing.B) {
	benchmarkBigRedis(b, 1, 2)
}

// BenchmarkBigRedisNode is BenchmarkBigRedisWorker with its resumes on
// the other of two nodes (one worker each), which downloads the snapshot.
func BenchmarkBigRedisNode(b *testing.B) {
	benchmarkBigRedis(b, 2, 1)
}

func benchmarkBigRedis(b *testing.B, nodes, workers int) {
	c := newCluster(b, clusterOptions{backend: "sqlite", nodes: nodes, workersPerNode: workers})
	tmpl := redisTemplate(buildRedisImage(b, b.TempDir()))
	c.applyTemplate(tmpl)
	c.applyTemplate(counterTemplate(b, "counter", nil))
	c.createActor("big", "redis")
	ip := c.mustResume("big").GetStatus().GetWorker().GetIp()
	fillRedis(b, ip)
	// The node takes the entrypoint from the image; a raw sandbox is told.
	raw := newRawSandbox(b, c, tmpl.GetSpec(), []string{"/usr/bin/redis-server"}, redisReady)
	fillRedis(b, raw.slot.IP)
	b.ReportMetric(valuesRatio(b), "values-zstd-ratio")

	b.Run("suspend-resume", func(b *testing.B) {
		var suspend, resume, capture, upload, fetch, start, ready latency.Samples
		var rawCkpt, rawRestore, rawBackground, rawZeroCkpt latency.Samples
		var memory, stored, imageBytes, zeroImageBytes int64
		for range b.N {
			from := c.actor("big").GetStatus().GetWorker()
			if st, err := c.nodeOf(b, from.GetNode()).runtime.Stats(c.ctx, c.slotOf(b, from)); err == nil {
				memory = st.MemoryBytes
			}
			steps := c.stepSums(b)
			t0 := time.Now()
			s := c.suspend("big")
			suspend.Add(time.Since(t0))
			if s.GetStatus().GetState() != torporv1.ActorState_ACTOR_STATE_SUSPENDED {
				b.Fatalf("big after its suspend: %v", s.GetStatus())
			}
			d := c.stepSums(b).minus(steps)
			capture.Add(d["checkpoint/capture"])
			upload.Add(d["checkpoint/upload"])
			stored = c.snapshotSize(b, s.GetStatus().GetLatestSnapshot())

			// The worker it left is taken, so it resumes elsewhere: on the
			// node's other worker, or on the other node.
			holder := c.holdWorker(func(w *torporv1.WorkerRef) bool { return w.GetName() == from.GetName() })
			steps = c.stepSums(b)
			t0 = time.Now()
			a := c.mustResume("big")
			resume.Add(time.Since(t0))
			d = c.stepSums(b).minus(steps)
			fetch.Add(d["start/fetch"])
			start.Add(d["start/start"])
			ready.Add(d["start/ready"])
			to := a.GetStatus().GetWorker()
			if to.GetName() == from.GetName() || (nodes > 1) != (to.GetNode() != from.GetNode()) {
				b.Fatalf("big resumed on worker %s of node %s, from %s of %s", to.GetName(), to.GetNode(), from.GetName(), from.GetNode())
			}
			checkRedis(b, to.GetIp())
			c.suspend(holder)

			ck, rs, size := raw.cycle(b, cyclePlain)
			rawCkpt.Add(ck)
			rawRestore.Add(rs)
			imageBytes = size
			ck, rs, _ = raw.cycle(b, cycleBackground)
			rawBackground.Add(rs)
			rawCkpt.Add(ck)
			checkRedis(b, raw.slot.IP)
			ck, _, size = raw.cycle(b, cycleZeroPages)
			rawZeroCkpt.Add(ck)
			zeroImageBytes = size
		}
		suspend.Report(b, "suspend", 0.50, 0.95)
		resume.Report(b, "resume", 0.50, 0.95)
		rawCkpt.Report(b, "runsc-checkpoint", 0.50)
		rawRestore.Report(b, "runsc-restore", 0.50)
		rawBackground.Report(b, "runsc-restore-background", 0.50)
		rawZeroCkpt.Report(b, "runsc-checkpoint-nozero", 0.50)
		for name, s := range map[string]latency.Samples{"capture": capture, "upload": upload, "fetch": fetch, "start": start, "ready": ready} {
			s.Report(b, "step-"+name, 0.50)
		}
		b.ReportMetric(suspend.Millis(0.50)/rawCkpt.Millis(0.50), "suspend/runsc-p50")
		b.ReportMetric(resume.Millis(0.50)/rawRestore.Millis(0.50), "resume/runsc-p50")
		b.ReportMetric(float64(memory)/1e6, "sandbox-MB")
		b.ReportMetric(float64(imageBytes)/1e6, "image-MB")
		b.ReportMetric(float64(zeroImageBytes)/1e6, "image-nozero-MB")
		b.ReportMetric(float64(stored)/1e6, "stored-MB")
		b.ReportMetric(float64(memory)/float64(stored), "sandbox/stored")
		c.reportDisk(b)
	})
}

// redisValue is value i of the big Redis actor: a JSON-like record of
// words from a small vocabulary and random hex tokens, so it compresses
// about as much as application data (values-zstd-ratio), not like zeros.
func redisValue(i int) []byte {
	words := [...]string{"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa"}
	rng := rand.New(rand.NewPCG(uint64(i), 17))
	v := fmt.Appendf(nil, `{"id":%d,"items":[`, i)
	for len(v) < bigRedisValueSize {
		v = fmt.Appendf(v, `{"name":"%s %s","token":"%016x%016x","qty":%d},`, words[rng.IntN(len(words))], words[rng.IntN(len(words))], rng.Uint64(), rng.Uint64(), rng.IntN(1000))
	}
	return v[:bigRedisValueSize]
}

// valuesRatio is how much the first values shrink with zstd at the level
// snapshots use.
func valuesRatio(b *testing.B) float64 {
	var raw []byte
	for i := range 2000 {
		raw = append(raw, redisValue(i)...)
	}
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		b.Fatal(err)
	}
	defer enc.Close()
	return float64(len(raw)) / float64(len(enc.EncodeAll(raw, nil)))
}

func redisKey(i int) string { return "key:" + strconv.Itoa(i) }

// resp is a connection speaking Redis's protocol, enough for SET, GET,
// DBSIZE and PING.
type resp struct {
	conn net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
}

func dialRedis(ip string) (*resp, error) {
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip, "6379"), 2*time.Second)
	if err != nil {
		return nil, err
	}
	return &resp{conn: conn, r: bufio.NewReaderSize(conn, 1<<16), w: bufio.NewWriterSize(conn, 1<<16)}, nil
}

func (c *resp) send(args ...[]byte) error {
	fmt.Fprintf(c.w, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(c.w, "$%d\r\n", len(a))
		c.w.Write(a)
		c.w.WriteString("\r\n")
	}
	return c.w.Flush()
}

// reply reads one reply: a status, integer or bulk string, or an error.
func (c *resp) reply() (string, error) {
	line, err := c.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	switch {
	case line == "":
		return "", fmt.Errorf("redis: empty reply")
	case line[0] == '-':
		return "", fmt.Errorf("redis: %s", line[1:])
	case line[0] != '$':
		return line[1:], nil
	}
	n, err := strconv.Atoi(line[1:])
	if err != nil || n < 0 {
		return "", fmt.Errorf("redis: bulk reply %q", line)
	}
	buf := make([]byte, n+2)
	if _, err := io.ReadFull(c.r, buf); err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

func (c *resp) do(args ...string) (string, error) {
	bs := make([][]byte, len(args))
	for i, a := range args {
		bs[i] = []byte(a)
	}
	if err := c.send(bs...); err != nil {
		return "", err
	}
	return c.reply()
}

// fillRedis sets the big actor's keys in the Redis at ip, pipelined: the
// replies are read as the commands go out.
func fillRedis(b *testing.B, ip string) {
	b.Helper()
	c, err := dialRedis(ip)
	if err != nil {
		b.Fatal(err)
	}
	defer c.conn.Close()
	read := make(chan error, 1)
	go func() {
		for range bigRedisKeys {
			if r, err := c.reply(); err != nil || r != "OK" {
				read <- fmt.Errorf("SET: %q %w", r, err)
				return
			}
		}
		read <- nil
	}()
	for i := range bigRedisKeys {
		fmt.Fprintf(c.w, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n", len(redisKey(i)), redisKey(i), bigRedisValueSize)
		c.w.Write(redisValue(i))
		c.w.WriteString("\r\n")
	}
	if err := c.w.Flush(); err != nil {
		b.Fatal(err)
	}
	if err := <-read; err != nil {
		b.Fatalf("fill the Redis at %s: %v", ip, err)
	}
	checkRedis(b, ip)
}

// checkRedis fails unless the Redis at ip holds all the keys, sampled.
func checkRedis(b *testing.B, ip string) {
	b.Helper()
	if err := verifyRedis(ip); err != nil {
		b.Fatal(err)
	}
}

func verifyRedis(ip string) error {
	c, err := dialRedis(ip)
	if err != nil {
		return err
	}
	defer c.conn.Close()
	if n, err := c.do("DBSIZE"); err != nil || n != strconv.Itoa(bigRedisKeys) {
		return fmt.Errorf("DBSIZE of the Redis at %s: %q %v, want %d", ip, n, err, bigRedisKeys)
	}
	for _, i := range []int{0, rand.IntN(bigRedisKeys), bigRedisKeys - 1} {
		if v, err := c.do("GET", redisKey(i)); err != nil || v != string(redisValue(i)) {
			return fmt.Errorf("GET %s of the Redis at %s: %.40q %v, want %.40q", redisKey(i), ip, v, err, redisValue(i))
		}
	}
	return nil
}

// redisReady: the Redis at ip answers PING.
func redisReady(ip string) error {
	c, err := dialRedis(ip)
	if err != nil {
		return err
	}
	defer c.conn.Close()
	if r, err := c.do("PING"); err != nil || r != "PONG" {
		return fmt.Errorf("PING: %q %w", r, err)
	}
	return nil
}

// httpReady: the program at ip answers GET /readyz on port 8080.
func httpReady(ip string) error {
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Second}
	resp, err := client.Get("http://" + net.JoinHostPort(ip, "8080") + "/readyz")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %s", resp.Status)
	}
	return nil
}

// holdWorker resumes fresh counter actors until one takes a free worker
// that taken says is the one to hold, and returns its name: the next
// resume goes elsewhere. Holders that land on other workers on the way
// are suspended again.
func (c *cluster) holdWorker(taken func(*torporv1.WorkerRef) bool) string {
	c.t.Helper()
	var elsewhere []string
	for range 8 {
		name := "hold-" + randomHex(4)
		c.createActor(name, "counter")
		if taken(c.mustResume(name).GetStatus().GetWorker()) {
			for _, other := range elsewhere {
				c.suspend(other)
			}
			return name
		}
		elsewhere = append(elsewhere, name)
	}
	c.t.Fatalf("no worker to hold taken after %d resumes", len(elsewhere))
	return ""
}

func (c *cluster) nodeOf(b *testing.B, name string) *nodeAgent {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	b.Fatalf("no node %s in the cluster", name)
	return nil
}

// slotOf is the runtime slot of worker w.
func (c *cluster) slotOf(b *testing.B, w *torporv1.WorkerRef) runtime.Slot {
	n := c.nodeOf(b, w.GetNode())
	for i := range n.workers {
		if node.WorkerName(n.name, i) != w.GetName() {
			continue
		}
		slot, err := n.network.Slot(c.ctx, w.GetName(), i)
		if err != nil {
			b.Fatal(err)
		}
		return slot
	}
	b.Fatalf("no slot of worker %s", w.GetName())
	return runtime.Slot{}
}

// snapshotSize is the bytes snapshot uid takes in snapshot storage.
func (c *cluster) snapshotSize(b *testing.B, uid string) int64 {
	b.Helper()
	resp, err := c.snapshots.ListSnapshots(c.ctx, connect.NewRequest(&torporv1.ListRequest{Space: "default", PageSize: 1000}))
	if err != nil {
		b.Fatal(err)
	}
	for _, s := range resp.Msg.GetSnapshots() {
		if s.GetMetadata().GetUid() == uid || s.GetMetadata().GetName() == uid {
			return s.GetSizeBytes()
		}
	}
	b.Fatalf("no snapshot %s", uid)
	return 0
}

// reportDisk reports the disk the nodes' snapshot cache and local
// checkpoints take (the largest of the nodes), against the bytes of every
// snapshot the run stored (compressed).
func (c *cluster) reportDisk(b *testing.B) {
	b.Helper()
	var disk int64
	for _, n := range c.nodes {
		disk = max(disk, diskUse(b, filepath.Join(n.state, "cache"))+diskUse(b, filepath.Join(n.state, "local"))+diskUse(b, filepath.Join(n.state, "local-trees")))
	}
	resp, err := c.snapshots.ListSnapshots(c.ctx, connect.NewRequest(&torporv1.ListRequest{Space: "default", PageSize: 1000}))
	if err != nil {
		b.Fatal(err)
	}
	var stored int64
	for _, s := range resp.Msg.GetSnapshots() {
		stored += s.GetSizeBytes()
	}
	b.ReportMetric(float64(disk)/1e6, "node-disk-MB")
	b.ReportMetric(float64(stored)/1e6, "snapshots-MB")
	b.ReportMetric(float64(disk)/float64(stored), "disk/snapshots")
}

// diskUse is the disk space the files under dir take (their blocks).
func diskUse(b *testing.B, dir string) int64 {
	var total int64
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			total += st.Blocks * 512
		}
		return nil
	})
	if err != nil {
		b.Fatalf("disk use of %s: %v", dir, err)
	}
	return total
}

// stepSums are the agent's step durations summed over the cluster's
// nodes, by "operation/step" (torpor_node_step_seconds).
type stepSums map[string]time.Duration

func (c *cluster) stepSums(b *testing.B) stepSums {
	sums := stepSums{}
	for _, n := range c.nodes {
		families, err := n.metrics.Gather()
		if err != nil {
			b.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() != "torpor_node_step_seconds" {
				continue
			}
			for _, m := range f.GetMetric() {
				var op, step string
				for _, l := range m.GetLabel() {
					switch l.GetName() {
					case "operation":
						op = l.GetValue()
					case "step":
						step = l.GetValue()
					}
				}
				sums[op+"/"+step] += time.Duration(m.GetHistogram().GetSampleSum() * float64(time.Second))
			}
		}
	}
	return sums
}

func (s stepSums) minus(before stepSums) stepSums {
	d := stepSums{}
	for k, v := range s {
		d[k] = v - before[k]
	}
	return d
}

// rawSandbox is a workload in a gVisor sandbox that plain runsc
// checkpoints and restores, in a slot of the cluster's first node network
// beyond the agent's workers: no control plane, agent or snapshot storage.
type rawSandbox struct {
	*rawCounter
	ready func(ip string) error
}

// The raw cycles: restore with runsc's flags as the runtime uses them, or
// with --background (pages loaded after restore returns), or checkpoint
// with --exclude-committed-zero-pages.
const (
	cyclePlain = iota
	cycleBackground
	cycleZeroPages
)

func newRawSandbox(b *testing.B, c *cluster, spec *torporv1.TemplateSpec, command []string, ready func(ip string) error) *rawSandbox {
	b.Helper()
	if command != nil {
		spec = proto.CloneOf(spec)
		spec.GetContainers()[0].Command = command
	}
	r := &rawSandbox{rawCounter: bootRaw(b, c, "raw", runtimetest.Runsc(b), 0, spec), ready: ready}
	r.waitReady(b, time.Minute)
	return r
}

func (r *rawSandbox) waitReady(b *testing.B, limit time.Duration) {
	b.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := r.ready(r.slot.IP)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("the raw sandbox at %s is not ready after %s: %v", r.slot.IP, limit, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// cycle checkpoints the sandbox and restores it (the variant says how),
// and returns how long the checkpoint took, how long the restore took to
// ready, and the image's size.
func (r *rawSandbox) cycle(b *testing.B, variant int) (checkpoint, restore time.Duration, size int64) {
	b.Helper()
	img := filepath.Join(r.images, strconv.Itoa(r.restore))
	args := []string{"checkpoint", "--compression=none", "--image-path=" + img}
	if variant == cycleZeroPages {
		args = append(args, "--exclude-committed-zero-pages")
	}
	t0 := time.Now()
	r.run(b, append(args, r.id)...)
	checkpoint = time.Since(t0)
	size = diskUse(b, img)
	r.run(b, "delete", "--force", r.id)
	if err := netns.Configure(context.Background(), r.slot); err != nil {
		b.Fatal(err)
	}
	r.restore++
	r.id = fmt.Sprintf("%s_r%d", r.slot.Name, r.restore)
	args = []string{"restore", "--detach", "--image-path=" + img, "--bundle=" + r.bundle}
	if variant == cycleBackground {
		args = append(args, "--background")
	}
	t0 = time.Now()
	r.run(b, append(args, r.id)...)
	r.waitReady(b, 30*time.Second)
	restore = time.Since(t0)
	if err := os.RemoveAll(img); err != nil {
		b.Fatal(err)
	}
	return checkpoint, restore, size
}
