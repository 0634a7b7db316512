// Open a notebook in JupyterLab, run its first cell, and report what the page shows.
// Usage: node lab.mjs NOTEBOOK_URL SCREENSHOT_PATH
import { openPage } from "./browser.mjs";

const [url, screenshot] = process.argv.slice(2);
const { browser, page } = await openPage({ width: 1280, height: 860 });
try {
  await page.goto(url);
  const cell = page.locator(".jp-Notebook .jp-CodeCell").first();
  await cell.waitFor({ timeout: 120_000 });
  // Run only once the kernel (in the gateway's sandbox) shows as idle in the status bar.
  await page.getByText(/\| Idle$/).first().waitFor({ timeout: 120_000 });
  await cell.locator(".jp-InputArea-editor").click();
  await page.keyboard.press("Shift+Enter");
  const image = cell.locator(".jp-OutputArea-output img");
  await image.waitFor({ timeout: 120_000 });
  await page.waitForTimeout(500);
  const text = await cell.locator(".jp-OutputArea").innerText();
  const size = await image.evaluate((img) => [img.naturalWidth, img.naturalHeight]);
  await page.screenshot({ path: screenshot });
  console.log(JSON.stringify({ text, image: size }));
} catch (error) {
  // Keep what the page showed: it says more than a timeout does.
  await page.screenshot({ path: screenshot.replace(/\.png$/, "-failed.png") });
  throw error;
} finally {
  await browser.close();
}
