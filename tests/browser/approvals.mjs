// Open the approvals page, check what it shows of a held execute, approve it, and report.
// Usage: node approvals.mjs PAGE_URL_WITH_TOKEN SCREENSHOT_PATH
import { chromium } from "playwright-core";

const [url, screenshot] = process.argv.slice(2);
let page;
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
});
try {
  page = await browser.newPage({ viewport: { width: 1100, height: 720 } });
  page.on("console", (m) => { if (m.type() !== "debug") console.error(`[page] ${m.text()}`); });
  await page.goto(url);
  const card = page.locator(".card").first();
  await card.waitFor({ timeout: 30_000 });
  const flagged = await card.locator(".ln.hit").evaluateAll((ls) => ls.map((l) => l.dataset.n));
  const findings = await card.locator(".findings").innerText();
  const keywords = await card.locator("pre .kw").count();
  // A second request arrives while the page is open: it must appear without a reload.
  console.error("READY");
  await page.locator(".card").nth(1).waitFor({ timeout: 30_000 });
  await card.locator(".reason").fill("looks fine");
  await page.screenshot({ path: screenshot });
  await card.locator("button.approve").click();
  await page.locator(".card").nth(1).waitFor({ state: "detached", timeout: 30_000 });
  const left = await page.locator(".card").count();
  console.log(JSON.stringify({ flagged, findings, keywords, left }));
} catch (error) {
  if (page) await page.screenshot({ path: screenshot.replace(/\.png$/, "-failed.png") });
  throw error;
} finally {
  await browser.close();
}
