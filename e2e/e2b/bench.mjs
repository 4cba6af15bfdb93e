// Timings of the E2B SDK against Torpor (e2e/e2b_bench_test.go runs it,
// with the environment sdk.test.mjs documents, and TORPOR_E2B_ROUNDS):
// per round, create a sandbox, run its first command, pause it, connect
// (resume) and run a command again, kill it. Prints one JSON object of
// each step's durations in milliseconds.
const sdk = await import(process.env.TORPOR_E2B_SDK ?? 'e2b')
const { Sandbox } = sdk
const template = process.env.TORPOR_E2B_TEMPLATE
const rounds = Number(process.env.TORPOR_E2B_ROUNDS ?? '5')

const steps = { create: [], firstCommand: [], pause: [], connect: [], commandAfterConnect: [] }
async function timed(step, fn) {
  const start = performance.now()
  const v = await fn()
  steps[step].push(performance.now() - start)
  return v
}

for (let i = 0; i < rounds; i++) {
  const sbx = await timed('create', () => Sandbox.create(template))
  try {
    await timed('firstCommand', () => sbx.commands.run('echo ready'))
    await timed('pause', () => sbx.pause())
    const back = await timed('connect', () => Sandbox.connect(sbx.sandboxId))
    await timed('commandAfterConnect', () => back.commands.run('echo again'))
  } finally {
    await sbx.kill()
  }
}
console.log(JSON.stringify(steps))
