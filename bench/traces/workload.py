# The python-json trace's program (bench/traces/record.sh): a short run of the
# standard library's heavier modules on generated records, deterministic.
import collections
import csv
import datetime
import hashlib
import io
import json
import re
import statistics

rows = []
for i in range(400):
    day = datetime.date(2020, 1, 1) + datetime.timedelta(days=i % 700)
    rows.append({"id": i, "name": f"item-{(i * 7919) % 10007:05d}", "day": day.isoformat(),
                 "price": round((i * 37 % 1000) / 7.0, 2), "tags": ["t%d" % (i % k) for k in (3, 5, 7)]})
text = json.dumps(rows, indent=1, sort_keys=True)
back = json.loads(text)
pat = re.compile(r'"name": "item-(\d+)"')
ids = [int(m.group(1)) for m in pat.finditer(text)]
by_tag = collections.Counter(t for r in back for t in r["tags"])
out = io.StringIO()
w = csv.DictWriter(out, fieldnames=["id", "name", "day", "price"], extrasaction="ignore")
w.writeheader()
w.writerows(sorted(back, key=lambda r: (r["day"], r["name"])))
digest = hashlib.sha256(out.getvalue().encode()).hexdigest()
print(len(ids), by_tag.most_common(3), statistics.mean(r["price"] for r in back), digest[:16])
