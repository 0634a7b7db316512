// Debian's Chromium, headless, as every browser test opens it (playwright-core downloads none).
import { chromium } from "playwright-core";

// A browser and one page whose console is echoed to stderr (it says more than a timeout).
export async function openPage(viewport) {
  const browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    args: [
      "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
    ],
  });
  const page = await browser.newPage({ viewport });
  page.on("console", (m) => { if (m.type() !== "debug") console.error(`[page] ${m.text()}`); });
  return { browser, page };
}
