// A sandbox's egress through the E2B SDK's network options against
// Torpor (e2e/e2b_test.go runs it with the environment sdk.test.mjs
// documents, TORPOR_E2B_TEMPLATE's policy an allowlist of *.example.com
// and 198.51.100.0/24, its space's egress bounds that range): allowOut
// with denyOut ALL_TRAFFIC, read back by getInfo; allowInternetAccess
// false; and the refusals, each naming the entry. Prints one JSON object: the ID of the allowlisted sandbox, left
// running for the test to describe, and the refusals' messages.
import assert from 'node:assert/strict'

const sdk = await import(process.env.TORPOR_E2B_SDK ?? 'e2b')
const { Sandbox } = sdk
const template = process.env.TORPOR_E2B_TEMPLATE
// ALL_TRAFFIC's value: the 2.50 SDK does not export the constant.
const allTraffic = '0.0.0.0/0'

const sbx = await Sandbox.create(template, { network: { allowOut: ['api.example.com', '198.51.100.7'], denyOut: [allTraffic] } })
const info = await Sandbox.getInfo(sbx.sandboxId)
assert.deepEqual(info.network?.allowOut, ['api.example.com', '198.51.100.7'], 'getInfo: allowOut as created')
assert.deepEqual(info.network?.denyOut, [allTraffic], 'getInfo: denyOut as created')

const closed = await Sandbox.create(template, { allowInternetAccess: false })
try {
  const closedInfo = await Sandbox.getInfo(closed.sandboxId)
  assert.equal(closedInfo.allowInternetAccess, false, 'getInfo: allowInternetAccess false')
} finally {
  await closed.kill()
}

// refused is the message of the SDK's error for a create with network,
// which must name what.
async function refused(network, what) {
  let err
  try {
    const s = await Sandbox.create(template, { network })
    await s.kill()
  } catch (e) {
    err = e
  }
  assert.ok(err, `create with ${JSON.stringify(network)}: succeeded, want refused`)
  assert.ok(err.message.includes(what), `create with ${JSON.stringify(network)}: ${err.message}, want it to name ${what}`)
  return err.message
}
const refusals = [
  // The control plane refuses these: outside the template's allowlist,
  // and outside the space's egress bounds (198.51.100.0/24).
  await refused({ allowOut: ['api.example.com', 'api.example.net'], denyOut: [allTraffic] }, 'network.allowOut[1] ("api.example.net")'),
  await refused({ allowOut: ['api.example.com', '203.0.113.9'], denyOut: [allTraffic] }, 'network.allowOut[1] ("203.0.113.9")'),
  await refused({ allowOut: ['a.*.example.com'], denyOut: [allTraffic] }, 'network.allowOut[0] ("a.*.example.com")'),
  await refused({ denyOut: ['8.8.8.8'] }, 'network.denyOut[0]: "8.8.8.8"'),
  await refused({ allowOut: ['api.example.com'] }, 'network.allowOut: an allow list without denyOut'),
]
console.log(JSON.stringify({ sandboxId: sbx.sandboxId, refusals }))
