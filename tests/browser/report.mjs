// Open a replay report (a local file), check what it shows, and take a screenshot.
// Usage: node report.mjs REPORT_HTML SCREENSHOT_PATH
import { pathToFileURL } from "node:url";
import { openPage } from "./browser.mjs";

const [report, screenshot] = process.argv.slice(2);
const { browser, page } = await openPage({ width: 1200, height: 900 });
try {
  await page.goto(pathToFileURL(report).href);
  const cells = await page.locator("section.cell").evaluateAll((cs) =>
    cs.map((c) => ({
      result: c.querySelector(".badge").textContent,
      recorded: c.querySelector(".recorded").innerText,
      replayed: c.querySelector(".replayed").innerText,
      diff: c.querySelector(".diff")?.innerText ?? "",
    })));
  // Every image decoded (a broken data URL has no natural width).
  const images = await page.locator("img").evaluateAll((is) =>
    is.map((i) => ({ side: i.closest(".side").classList[1], width: i.naturalWidth })));
  const verdict = await page.locator(".verdict").innerText();
  // HTML outputs render in sandboxed frames: shown, but their scripts never run.
  const frames = await Promise.all(page.frames().slice(1).map((f) => f.locator("body").innerText()));
  const title = await page.title();
  // The whole page at once: sandboxed frames paint out of process, so no fullPage stitching.
  const height = await page.evaluate(() => document.documentElement.scrollHeight);
  await page.setViewportSize({ width: 1200, height });
  await page.waitForTimeout(300);
  await page.screenshot({ path: screenshot });
  console.log(JSON.stringify({ verdict, cells, images, frames, title }));
} finally {
  await browser.close();
}
