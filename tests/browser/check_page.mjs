// Opens one HTML file graphloom wrote in headless Chromium (Debian's
// /usr/bin/chromium, driven by playwright-core) and prints what the tests
// check, as one JSON object on stdout:
//
//   {"errors": [...], "counts": {...}, "steps": [{"set": ..., "counts": {...}}]}
//
// `errors` holds every console error, uncaught exception and failed request
// (a self-contained page makes no request at all, so any is an error);
// `counts` the data-* attributes of the element marked
// `data-graphloom-counts` once the page says it is ready
// (`document.body.dataset.ready === "true"`).
//
// Usage: node check_page.mjs PAGE.html [--set SELECTOR=VALUE]... [--screenshot OUT.png]
// Each --set fills an input or selects an option, fires `input` and
// `change`, and records the counts after it.
//
// NODE_PATH must reach playwright-core (scripts/setup.sh installs it under
// /var/cache/graphloom-tools/playwright); CHROMIUM overrides the browser.
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";
import path from "node:path";

const require = createRequire(import.meta.url);
const { chromium } = require("playwright-core");

const args = process.argv.slice(2);
const page_path = args.shift();
if (!page_path) {
  console.error("usage: check_page.mjs PAGE.html [--set SELECTOR=VALUE]... [--screenshot OUT.png]");
  process.exit(2);
}
const sets = [];
let screenshot = null;
while (args.length) {
  const flag = args.shift();
  const value = args.shift();
  if (value === undefined) {
    console.error(`${flag} needs a value`);
    process.exit(2);
  }
  if (flag === "--set") {
    const eq = value.indexOf("=");
    if (eq < 1) {
      console.error(`--set wants SELECTOR=VALUE, got ${value}`);
      process.exit(2);
    }
    sets.push({ selector: value.slice(0, eq), value: value.slice(eq + 1) });
  } else if (flag === "--screenshot") {
    screenshot = value;
  } else {
    console.error(`unknown flag ${flag}`);
    process.exit(2);
  }
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  // The flags keep Chromium from reaching out to Google's services, which
  // a closed network refuses (and which a self-contained page never needs).
  args: [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});
const errors = [];
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 860 } });
  page.on("console", (msg) => {
    if (msg.type() === "error") errors.push(`console: ${msg.text()}`);
  });
  page.on("pageerror", (err) => errors.push(`exception: ${err.message}`));
  page.on("request", (req) => {
    const url = req.url();
    if (!url.startsWith("file:") && !url.startsWith("data:") && !url.startsWith("blob:")) {
      errors.push(`request: ${url}`);
    }
  });
  page.on("requestfailed", (req) => errors.push(`request failed: ${req.url()}`));

  await page.goto(pathToFileURL(path.resolve(page_path)).href);
  // Bounded: a page that never gets ready fails the check after 60 s.
  await page.waitForFunction(() => document.body && document.body.dataset.ready === "true", null, {
    timeout: 60_000,
  });
  const counts = () =>
    page.evaluate(() => {
      const el = document.querySelector("[data-graphloom-counts]");
      return el ? { ...el.dataset } : null;
    });
  const result = { errors, counts: await counts(), steps: [] };
  for (const { selector, value } of sets) {
    const handle = await page.waitForSelector(selector, { timeout: 10_000 });
    const tag = await handle.evaluate((el) => el.tagName);
    if (tag === "SELECT") {
      await handle.selectOption(value);
    } else {
      await handle.evaluate((el, v) => {
        el.value = v;
        el.dispatchEvent(new Event("input", { bubbles: true }));
        el.dispatchEvent(new Event("change", { bubbles: true }));
      }, value);
    }
    await page.waitForFunction(() => document.body.dataset.ready === "true", null, { timeout: 60_000 });
    result.steps.push({ set: `${selector}=${value}`, counts: await counts() });
  }
  if (screenshot) await page.screenshot({ path: screenshot, fullPage: true });
  console.log(JSON.stringify(result));
} finally {
  await browser.close();
}
