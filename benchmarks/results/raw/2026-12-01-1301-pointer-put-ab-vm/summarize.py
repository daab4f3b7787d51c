import json, glob, re, statistics, sys
res = {}
for f in sorted(glob.glob('/tmp/pstore-ab/*/raw/*/rows.json')):
    m = re.search(r'/(base|new)-(\d+)/', f)
    t, r = m.group(1), int(m.group(2))
    d = json.load(open(f))
    for row in d['rows']:
        if row['row'] != 'embedded':
            continue
        gbs = lambda s: row['bytes'] / statistics.median(s) / 1e9
        res.setdefault((row['object_mb'], t), []).append((r, round(gbs(row['store_s']), 2), round(gbs(row['load_s']), 2)))
for k in sorted(res):
    v = sorted(res[k])
    print(k, 'runs', [x[0] for x in v])
    print('   store', [x[1] for x in v], 'median', statistics.median(x[1] for x in v))
    print('   load ', [x[2] for x in v], 'median', statistics.median(x[2] for x in v))
