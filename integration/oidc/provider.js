// A real OpenID provider for integration/test_oidc.py: the certified `oidc-provider`
// package on a loopback port chosen by the OS (printed as `PORT=<n>`), with one
// confidential client (PKCE required), test users with groups, and the package's own
// development login form (any password; the login typed is the user's subject).
//
//   node provider.js <node_modules dir> <redirect uri> <client secret> [clock skew seconds]
//
// A negative clock skew runs the provider's clock behind the real one, so the ID tokens
// it issues are already expired when a client checks them (deterministic, no sleeps).
//
// Environment: OIDC_ACCESS_TTL (seconds an access token lives; default 3600) and
// OIDC_GROUPS_IN_USERINFO_ONLY=1 (the ID token carries no scope claims; userinfo does).
//
// A test hook outside the provider's routes changes a user's groups at once, as an
// administrator of the identity provider would:
//   POST /test/users/<subject>/groups  with a JSON array body  → 204
import { createServer } from 'node:http';
import { generateKeyPairSync } from 'node:crypto';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const [modules, redirectUri, clientSecret, skewArg] = process.argv.slice(2);
if (!modules || !redirectUri || !clientSecret) {
  console.error('usage: provider.js <node_modules> <redirect uri> <client secret> [skew seconds]');
  process.exit(2);
}
const skew = Number(skewArg || 0) * 1000;
const accessTtl = Number(process.env.OIDC_ACCESS_TTL || 3600);
const userinfoOnly = process.env.OIDC_GROUPS_IN_USERINFO_ONLY === '1';
if (skew !== 0) {
  const realNow = Date.now;
  Date.now = () => realNow() + skew;
}

const { default: Provider } = await import(
  pathToFileURL(join(modules, 'oidc-provider', 'lib', 'index.js')).href
);

// The users the test signs in as: subject → claims.
const USERS = {
  alice: { email: 'alice@example.com', email_verified: true, groups: ['platform-admins', 'dev'] },
  vic: { email: 'vic@example.com', email_verified: true, groups: ['dev'] },
  tess: { email: 'tess@example.com', email_verified: true, groups: ['team-a'] },
  nora: { email: 'nora@example.com', email_verified: true, groups: ['marketing'] },
  // Claims an email an operator made from the CLI already has.
  mallory: { email: 'root@example.com', email_verified: true, groups: ['platform-admins'] },
};

const jwk = generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ format: 'jwk' });
jwk.kid = 'test-key';
jwk.alg = 'RS256';
jwk.use = 'sig';

// The groups hook; everything else is the provider's.
async function testHook(req, res) {
  const m = /^\/test\/users\/([^/]+)\/groups$/.exec(req.url);
  if (req.method !== 'POST' || !m) {
    return false;
  }
  let body = '';
  for await (const chunk of req) body += chunk;
  const groups = JSON.parse(body);
  const sub = decodeURIComponent(m[1]);
  USERS[sub] = { ...(USERS[sub] || {}), groups };
  res.writeHead(204).end();
  return true;
}

const server = createServer();
server.listen(0, '127.0.0.1', () => {
  const { port } = server.address();
  const issuer = `http://127.0.0.1:${port}`;
  const provider = new Provider(issuer, {
    clients: [
      {
        client_id: 'stategate',
        client_secret: clientSecret,
        redirect_uris: [redirectUri],
        response_types: ['code'],
        grant_types: ['authorization_code', 'refresh_token'],
        token_endpoint_auth_method: 'client_secret_basic',
      },
    ],
    jwks: { keys: [jwk] },
    pkce: { required: () => true },
    claims: {
      openid: ['sub'],
      email: ['email', 'email_verified'],
      groups: ['groups'],
    },
    scopes: ['openid', 'email', 'groups'],
    // Claims of the asked scopes go into the ID token itself (stategate reads the
    // groups from it), unless the test wants them in userinfo only.
    conformIdTokenClaims: userinfoOnly,
    // Every sign-in gets a refresh token (stategate renews an expired access token
    // with it when it re-checks a session).
    issueRefreshToken: async (_ctx, client) => client.grantTypeAllowed('refresh_token'),
    ttl: {
      IdToken: 600, AuthorizationCode: 60, Interaction: 3600, Session: 3600, Grant: 3600,
      AccessToken: accessTtl, RefreshToken: 3600,
    },
    cookies: { keys: ['test-cookie-key-0123456789abcdef'] },
    features: { devInteractions: { enabled: true } },
    async findAccount(_ctx, sub) {
      // Read at every use (userinfo, refresh), so a changed group shows at once.
      return { accountId: sub, claims: async () => ({ sub, ...(USERS[sub] || { groups: [] }) }) };
    },
    // A first-party client: consent is implied (the test fills in the login form only).
    async loadExistingGrant(ctx) {
      const grantId = ctx.oidc.result?.consent?.grantId
        || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
      if (grantId) {
        return ctx.oidc.provider.Grant.find(grantId);
      }
      const grant = new ctx.oidc.provider.Grant({
        clientId: ctx.oidc.client.clientId,
        accountId: ctx.oidc.session.accountId,
      });
      grant.addOIDCScope('openid email groups');
      grant.addOIDCClaims(['email', 'email_verified', 'groups']);
      await grant.save();
      return grant;
    },
  });
  const handler = provider.callback();
  server.on('request', async (req, res) => {
    if (!(await testHook(req, res))) {
      handler(req, res);
    }
  });
  console.log(`PORT=${port}`);
});
