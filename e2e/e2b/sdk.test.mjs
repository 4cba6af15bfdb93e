// The published E2B SDK against a real Torpor. e2e/e2b_test.go starts
// Torpor (torpor up, real gVisor), makes the keys and templates, and runs
// this file with node --test once per SDK generation:
//
//   TORPOR_E2B_SDK          the package to import: "e2b" (2.51) or "e2b-2.50"
//   E2B_API_URL             Torpor's E2B listener (--e2b-listen)
//   E2B_API_KEY             an E2B key of the space the templates are in
//   E2B_SANDBOX_URL         the router (plain HTTP: the SDK then names the
//                           sandbox in E2b-Sandbox-Id / E2b-Sandbox-Port)
//   TORPOR_E2B_TEMPLATE     a template of that space with bash and python3
//   TORPOR_E2B_OTHER_KEY    an E2B key of another space
//   TORPOR_ROUTER           host:port of the router, where getHost names
//                           resolve (the test has no wildcard DNS)
//   TORPOR_E2B_RESOLVE      (HTTPS) the domain whose names resolve to it
//
// Every step asserts what the SDK returned; a failure names the step.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import dns from 'node:dns'
import http from 'node:http'

// TORPOR_E2B_RESOLVE=DOMAIN: names under DOMAIN resolve to the router's
// address, as a wildcard DNS record for the domain would (the HTTPS run,
// where the SDK builds https://<port>-<id>.<domain> itself).
let resolvedSandboxNames = 0
if (process.env.TORPOR_E2B_RESOLVE) {
  const suffix = `.${process.env.TORPOR_E2B_RESOLVE}`
  const routerAddress = process.env.TORPOR_ROUTER.split(':')[0]
  const lookup = dns.lookup
  dns.lookup = (host, opts, cb) => {
    if (typeof opts === 'function') [cb, opts] = [opts, {}]
    if (!host.endsWith(suffix)) return lookup(host, opts, cb)
    resolvedSandboxNames++
    return opts?.all ? cb(null, [{ address: routerAddress, family: 4 }]) : cb(null, routerAddress, 4)
  }
}

const sdk = await import(process.env.TORPOR_E2B_SDK ?? 'e2b')
const { Sandbox, CommandExitError, NotFoundError, AuthenticationError } = sdk
const template = need('TORPOR_E2B_TEMPLATE')
const otherKey = need('TORPOR_E2B_OTHER_KEY')
const router = need('TORPOR_ROUTER')

function need(name) {
  const v = process.env[name]
  if (!v) throw new Error(`${name} is not set (e2e/e2b_test.go sets it)`)
  return v
}

// get fetches <host><path>, host being what getHost returned, resolved to
// the router as a wildcard DNS record for the domain would: https with
// fetch in the HTTPS run, else plain HTTP to the router's plain port.
async function get(host, path = '/') {
  if (process.env.TORPOR_E2B_RESOLVE) {
    // HTTPS: the URL a program builds from getHost, fetched as it would.
    const res = await fetch(`https://${host}${path}`, { signal: AbortSignal.timeout(30_000) })
    return { status: res.status, body: await res.text() }
  }
  const [routerHost, routerPort] = router.split(':')
  return new Promise((resolve, reject) => {
    const req = http.get({ host: routerHost, port: Number(routerPort), path, headers: { Host: host } }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (c) => (body += c))
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
    req.setTimeout(30_000, () => req.destroy(new Error(`GET ${host}${path}: no answer in 30 s`)))
  })
}

async function eventually(what, fn, timeoutMs = 30_000) {
  const deadline = Date.now() + timeoutMs
  let last
  for (;;) {
    try {
      const v = await fn()
      if (v) return v
    } catch (err) {
      last = err
    }
    if (Date.now() > deadline) throw new Error(`${what}: not within ${timeoutMs} ms${last ? `: ${last}` : ''}`)
    await new Promise((r) => setTimeout(r, 200))
  }
}

async function listAll(opts) {
  const paginator = Sandbox.list(opts)
  const out = []
  while (paginator.hasNext) out.push(...(await paginator.nextItems()))
  return out
}

const label = `run${randomBytes(4).toString('hex')}`
const sbx = await Sandbox.create(template, { metadata: { run: label, role: 'main' }, envs: { FROM_CREATE: 'create-env' } })
test.after(async () => {
  await sbx.kill().catch(() => {})
})

test('create gives an ID that fits one DNS label after <port>-', () => {
  assert.match(sbx.sandboxId, /^[a-z0-9]+$/)
  assert.ok(`49983-${sbx.sandboxId}`.length <= 63)
})

test('commands.run: output, exit codes 3 and 127, envs, cwd', async () => {
  const ok = await sbx.commands.run('echo hello; echo oops >&2')
  assert.equal(ok.exitCode, 0)
  assert.equal(ok.stdout, 'hello\n')
  assert.equal(ok.stderr, 'oops\n')

  await assert.rejects(sbx.commands.run('exit 3'), (err) => err instanceof CommandExitError && err.exitCode === 3)
  await assert.rejects(sbx.commands.run('no-such-command-here'), (err) => err instanceof CommandExitError && err.exitCode === 127)

  const env = await sbx.commands.run('echo "$FROM_CREATE $FROM_CALL"', { envs: { FROM_CALL: 'call-env' } })
  assert.equal(env.stdout, 'create-env call-env\n')

  await sbx.commands.run('mkdir -p /tmp/work')
  const cwd = await sbx.commands.run('pwd', { cwd: '/tmp/work' })
  assert.equal(cwd.stdout, '/tmp/work\n')
})

test('commands: stdin, background, list, connect, kill, timeout', async () => {
  const cat = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat.pid, 'through stdin\n')
  if (typeof sbx.commands.closeStdin === 'function') {
    await sbx.commands.closeStdin(cat.pid)
    const done = await cat.wait()
    assert.equal(done.stdout, 'through stdin\n')
  } else {
    await cat.kill()
  }

  const sleeper = await sbx.commands.run('sleep 600', { background: true })
  const listed = await sbx.commands.list()
  assert.ok(listed.some((p) => p.pid === sleeper.pid), `list ${JSON.stringify(listed)} lacks pid ${sleeper.pid}`)
  const again = await sbx.commands.connect(sleeper.pid)
  assert.equal(again.pid, sleeper.pid)
  assert.equal(await sbx.commands.kill(sleeper.pid), true)
  await assert.rejects(again.wait(), (err) => err instanceof CommandExitError)
  await eventually('the killed process leaves the list', async () => !(await sbx.commands.list()).some((p) => p.pid === sleeper.pid))

  const started = Date.now()
  await assert.rejects(sbx.commands.run('sleep 30', { timeoutMs: 1500 }))
  assert.ok(Date.now() - started < 20_000, 'the command timeout did not end the call')
})

test('files: text, 1 MiB binary, list, makeDir, exists, rename, remove, missing, watchDir', async () => {
  await sbx.files.makeDir('/tmp/files')
  await sbx.files.write('/tmp/files/a.txt', 'some text\n')
  assert.equal(await sbx.files.read('/tmp/files/a.txt'), 'some text\n')

  const blob = randomBytes(1 << 20)
  await sbx.files.write('/tmp/files/blob.bin', blob.buffer.slice(blob.byteOffset, blob.byteOffset + blob.length))
  const back = await sbx.files.read('/tmp/files/blob.bin', { format: 'bytes' })
  assert.equal(createHash('sha256').update(back).digest('hex'), createHash('sha256').update(blob).digest('hex'))

  const names = (await sbx.files.list('/tmp/files')).map((e) => e.name).sort()
  assert.deepEqual(names, ['a.txt', 'blob.bin'])
  assert.equal(await sbx.files.exists('/tmp/files/a.txt'), true)
  await sbx.files.rename('/tmp/files/a.txt', '/tmp/files/b.txt')
  assert.equal(await sbx.files.exists('/tmp/files/a.txt'), false)
  assert.equal(await sbx.files.read('/tmp/files/b.txt'), 'some text\n')
  await sbx.files.remove('/tmp/files/b.txt')
  assert.equal(await sbx.files.exists('/tmp/files/b.txt'), false)
  await assert.rejects(sbx.files.read('/tmp/files/missing.txt'), (err) => err instanceof NotFoundError)

  const events = []
  const watch = await sbx.files.watchDir('/tmp/files', (e) => events.push(e))
  await sbx.files.write('/tmp/files/watched.txt', 'x')
  await eventually('watchDir reports the new file', async () => events.some((e) => e.name === 'watched.txt'), 10_000)
  await watch.stop()
})

test('getHost(port) reaches a Python HTTP server in the sandbox', async () => {
  await sbx.commands.run('mkdir -p /tmp/www && echo served > /tmp/www/index.html')
  await sbx.commands.run('cd /tmp/www && python3 -m http.server 8000', { background: true })
  const host = sbx.getHost(8000)
  assert.equal(host.split('.')[0], `8000-${sbx.sandboxId}`)
  const res = await eventually('the Python server answers', async () => {
    const r = await get(host, '/index.html')
    return r.status === 200 ? r : undefined
  })
  assert.equal(res.body, 'served\n')
})

test('pause, then connect: file, background process (same PID) and its memory intact', async () => {
  // A process that keeps a count in memory and answers it on port 8001.
  await sbx.files.write('/tmp/count.py', [
    'import http.server',
    'n = 0',
    'class H(http.server.BaseHTTPRequestHandler):',
    '    def do_GET(self):',
    '        global n',
    '        n += 1',
    '        b = str(n).encode()',
    '        self.send_response(200); self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)',
    'http.server.HTTPServer(("0.0.0.0", 8001), H).serve_forever()',
    '',
  ].join('\n'))
  const counter = await sbx.commands.run('python3 /tmp/count.py', { background: true })
  const host = sbx.getHost(8001)
  await eventually('the counter answers', async () => (await get(host)).status === 200)
  const before = Number((await get(host)).body)
  await sbx.files.write('/tmp/kept.txt', 'kept across pause')

  assert.equal(await sbx.pause(), true)
  assert.equal((await sbx.getInfo()).state, 'paused')
  const paused = await get(host)
  assert.equal(paused.status, 502, `a paused sandbox's port answered ${paused.status}: ${paused.body}`)

  const back = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await back.getInfo()).state, 'running')
  assert.equal(await back.files.read('/tmp/kept.txt'), 'kept across pause')
  assert.ok((await back.commands.list()).some((p) => p.pid === counter.pid), 'the background process is gone after connect')
  const after = Number((await eventually('the counter answers after connect', async () => {
    const r = await get(host)
    return r.status === 200 ? r : undefined
  })).body)
  assert.equal(after, before + 1, 'the process lost its memory')
})

test('pty: a terminal of the size asked, resized', async () => {
  let out = ''
  const decoder = new TextDecoder()
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += decoder.decode(d) } })
  await sbx.pty.resize(term.pid, { cols: 100, rows: 30 })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size; exit\n'))
  await term.wait().catch(() => {})
  assert.match(out, /30 100/, `the terminal's output: ${JSON.stringify(out)}`)
})

test('autoResume: traffic resumes a paused sandbox', async () => {
  const woken = await Sandbox.create(template, { lifecycle: { onTimeout: 'pause', autoResume: true } })
  try {
    await woken.commands.run('mkdir -p /tmp/www && echo awake > /tmp/www/index.html')
    // Started detached, so that no stream of the SDK's (itself traffic,
    // which would resume the sandbox) stays open across the pause.
    await woken.commands.run('cd /tmp/www && (python3 -m http.server 8002 >/dev/null 2>&1 &)')
    const host = woken.getHost(8002)
    await eventually('the server answers', async () => (await get(host, '/index.html')).status === 200)
    await woken.pause()
    assert.equal((await woken.getInfo()).state, 'paused')
    const res = await get(host, '/index.html')
    assert.equal(res.status, 200, `a request to the paused autoResume sandbox: ${res.status} ${res.body}`)
    assert.equal(res.body, 'awake\n')
    assert.equal((await woken.getInfo()).state, 'running')
  } finally {
    await woken.kill()
  }
})

test('list by metadata and by state; setTimeout', async () => {
  const other = await Sandbox.create(template, { metadata: { run: label, role: 'second' } })
  try {
    const mine = await listAll({ query: { metadata: { run: label } } })
    assert.deepEqual(mine.map((s) => s.sandboxId).sort(), [sbx.sandboxId, other.sandboxId].sort())
    const second = await listAll({ query: { metadata: { run: label, role: 'second' } } })
    assert.deepEqual(second.map((s) => s.sandboxId), [other.sandboxId])

    await other.pause()
    const paused = await listAll({ query: { metadata: { run: label }, state: ['paused'] } })
    assert.deepEqual(paused.map((s) => s.sandboxId), [other.sandboxId])
    const running = await listAll({ query: { metadata: { run: label }, state: ['running'] } })
    assert.deepEqual(running.map((s) => s.sandboxId), [sbx.sandboxId])

    const end0 = new Date((await sbx.getInfo()).endAt).getTime()
    await sbx.setTimeout(3_600_000)
    const end1 = new Date((await sbx.getInfo()).endAt).getTime()
    assert.ok(end1 > end0 && Math.abs(end1 - (Date.now() + 3_600_000)) < 60_000, `endAt ${end0} → ${end1}`)
  } finally {
    await other.kill()
  }
})

test('the lease ends: auto-pause, then connect', async () => {
  const short = await Sandbox.create(template, { timeoutMs: 4000, lifecycle: { onTimeout: 'pause' } })
  try {
    await short.files.write('/tmp/lease.txt', 'before the end')
    await eventually('the sandbox is paused at the end of its lease', async () => (await short.getInfo()).state === 'paused', 60_000)
    const back = await Sandbox.connect(short.sandboxId)
    assert.equal(await back.files.read('/tmp/lease.txt'), 'before the end')
  } finally {
    await short.kill()
  }
})

test('the lease ends: killed by default', async () => {
  const short = await Sandbox.create(template, { timeoutMs: 3000 })
  await eventually('the sandbox is gone at the end of its lease', async () => {
    try {
      await short.getInfo()
      return false
    } catch (err) {
      if (err instanceof NotFoundError) return true
      throw err
    }
  }, 60_000)
})

test('another space\'s key can neither see nor touch a sandbox', async () => {
  const as = { apiKey: otherKey }
  const theirs = await listAll({ ...as, query: { metadata: { run: label } } })
  assert.deepEqual(theirs, [])
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId, as), (err) => err instanceof NotFoundError)
  await assert.rejects(Sandbox.connect(sbx.sandboxId, as), (err) => err instanceof NotFoundError)
  await assert.rejects(Sandbox.setTimeout(sbx.sandboxId, 10_000, as), (err) => err instanceof NotFoundError)
  await assert.rejects(Sandbox.pause(sbx.sandboxId, as), (err) => err instanceof NotFoundError)
  // kill of a sandbox the key cannot see answers false (not found), and
  // leaves it running.
  assert.equal(await Sandbox.kill(sbx.sandboxId, as), false)
  await assert.rejects(Sandbox.create(template, as), (err) => err instanceof NotFoundError || /template/i.test(String(err)))
  assert.equal((await sbx.getInfo()).state, 'running')
})

test('a bad key is refused', async () => {
  await assert.rejects(listAll({ apiKey: `e2b_${'0'.repeat(40)}` }), (err) => err instanceof AuthenticationError)
})

test('the in-sandbox API refuses a call without the access token', async () => {
  const [routerHost, routerPort] = router.split(':')
  const status = await new Promise((resolve, reject) => {
    const req = http.request({
      host: routerHost, port: Number(routerPort), method: 'POST', path: '/process.Process/List',
      headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983', 'Content-Type': 'application/json' },
    }, (res) => { res.resume(); resolve(res.statusCode) })
    req.on('error', reject)
    req.end('{}')
  })
  assert.equal(status, 401)
})

test('a sandbox cannot reach another sandbox\'s in-sandbox API', async () => {
  const peer = await Sandbox.create(template, { metadata: { run: label, role: 'peer' } })
  try {
    // From the sandbox, try port 49983 of every address of its own
    // network (the node's workers, the peer's among them) but its own.
    await sbx.files.write('/tmp/scan.py', [
      'import socket, ipaddress, concurrent.futures',
      'probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)',
      'probe.connect(("203.0.113.1", 9))',
      'me = probe.getsockname()[0]',
      'net = ipaddress.ip_network(me + "/24", strict=False)',
      'def reach(host):',
      '    s = socket.socket()',
      '    s.settimeout(0.5)',
      '    try:',
      '        s.connect((str(host), 49983))',
      '        return str(host)',
      '    except OSError:',
      '        return None',
      '    finally:',
      '        s.close()',
      'with concurrent.futures.ThreadPoolExecutor(64) as pool:',
      '    found = [h for h in pool.map(reach, (h for h in net.hosts() if str(h) != me)) if h]',
      'print(me, "reached:", " ".join(found) or "none")',
      '',
    ].join('\n'))
    const scan = await sbx.commands.run('python3 /tmp/scan.py', { timeoutMs: 120_000 })
    assert.match(scan.stdout, /reached: none\n$/, `the sandbox reached other sandboxes' in-sandbox API: ${scan.stdout}`)
  } finally {
    await peer.kill()
  }
})

test('kill: NotFound after, and not listed', async () => {
  const gone = await Sandbox.create(template, { metadata: { run: label, role: 'killed' } })
  assert.equal(await gone.kill(), true)
  await assert.rejects(Sandbox.getInfo(gone.sandboxId), (err) => err instanceof NotFoundError)
  const listed = await listAll({ query: { metadata: { run: label, role: 'killed' } } })
  assert.deepEqual(listed, [])
})

if (process.env.TORPOR_E2B_RESOLVE) {
  test('over HTTPS the SDK reached the sandboxes by their own names', () => {
    assert.ok(resolvedSandboxNames > 0, 'the SDK never looked up a <port>-<id> name: it did not use its https:// sandbox URLs')
  })
}
