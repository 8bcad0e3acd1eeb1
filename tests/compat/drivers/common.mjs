// What every Node driver shares: arguments, steps in order, one JSON result line.
export function args() {
  const a = { messages: 2000, partitions: 3, sessionTimeoutMs: 6000, deadline: 120 };
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '').replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    a[key] = ['messages', 'partitions', 'sessionTimeoutMs', 'deadline'].includes(key)
      ? Number(argv[i + 1]) : argv[i + 1];
  }
  return a;
}

export class Result {
  constructor(version) { this.version = version; this.steps = {}; }
  async step(name, fn) {
    let outcome;
    try {
      outcome = (await fn()) ?? 'ok';
    } catch (e) {
      console.error(e);
      outcome = `fail: ${e && e.name}: ${e && e.message}`.slice(0, 300);
    }
    this.steps[name] = outcome;
    return !outcome.startsWith('fail');
  }
  emit() { console.log(JSON.stringify({ version: this.version, steps: this.steps })); }
}

export function checkValues(values, expected) {
  const sorted = [...values].sort((x, y) => x - y);
  const ok = sorted.length === expected && sorted.every((v, i) => v === i);
  return ok ? 'ok'
    : `fail: ${values.length} received, ${new Set(values).size} distinct, ${expected} expected`;
}

export async function until(cond, seconds) {
  const end = Date.now() + seconds * 1000;
  while (!cond() && Date.now() < end) await new Promise((r) => setTimeout(r, 100));
  return cond();
}

export async function packageVersion(name) {
  const { readFile } = await import('node:fs/promises');
  const pkg = JSON.parse(await readFile(new URL(`./node_modules/${name}/package.json`,
    import.meta.url)));
  return pkg.version;
}
