// Open the approvals page, check what it shows of a held execute, approve it, and report.
// Usage: node approvals.mjs PAGE_URL_WITH_TOKEN SCREENSHOT_PATH
import { openPage } from "./browser.mjs";

const [url, screenshot] = process.argv.slice(2);
const { browser, page } = await openPage({ width: 1100, height: 720 });
try {
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
  await page.screenshot({ path: screenshot.replace(/\.png$/, "-failed.png") });
  throw error;
} finally {
  await browser.close();
}
