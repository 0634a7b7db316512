// A signed preview link in a browser: the page loads, its script's WebSocket reaches the app,
// and pages on preview URLs cannot use the viewer's credentials for the gateway.
// Usage: node preview.mjs HOST_FORM_LINK PATH_FORM_LINK APPROVALS_URL_WITH_TOKEN API_URL
import { openPage } from "./browser.mjs";

const [hostLink, pathLink, approvals, api] = process.argv.slice(2);
const { browser, page } = await openPage({ width: 800, height: 600 });
const attempt = (target) => page.evaluate(async (target) => {
  const tried = {};
  try { tried.token = sessionStorage.getItem("sbx-token"); } catch (e) { tried.token = `refused: ${e.name}`; }
  try {
    const r = await fetch(target, { credentials: "include" });
    tried.api = `answered ${r.status}`;
  } catch (e) { tried.api = `refused: ${e.name}`; }
  return tried;
}, target);
try {
  // The host form: its own origin. The link sets a cookie and leaves the address bar.
  await page.goto(hostLink);
  await page.waitForFunction(() => document.title.startsWith("echo"), null, { timeout: 30_000 });
  const host = { title: await page.title(), url: page.url(), ...(await attempt(api)) };
  // The gateway's own page keeps a token in its origin's sessionStorage...
  await page.goto(approvals);
  await page.waitForFunction(() => sessionStorage.getItem("sbx-token"), null, { timeout: 30_000 });
  // ...which a path-form preview, on the same host and port, must not reach.
  await page.goto(pathLink);
  await page.waitForFunction(() => document.readyState === "complete");
  const path = { url: page.url(), ...(await attempt(api)) };
  console.log(JSON.stringify({ host, path }));
} finally {
  await browser.close();
}
