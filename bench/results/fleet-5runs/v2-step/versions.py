"""Per version of the elastic scenario: the mean over runs of the slowest steady receiver's transfer time.
python3 versions.py FILE..."""
import json
import statistics
import sys

for f in sys.argv[1:]:
    d = json.load(open(f))
    keys = [k for k, v in d['runs_detail'][0]['metrics'].items()
            if k[:1] == 'v' and isinstance(v, list) and 'killed' not in k and 'warmup' not in k[3:] or k == 'v2_warmup']
    row = []
    for k in sorted(keys, key=lambda k: int(k[1:].split('_')[0])):
        xs = [max(x['transfer_ms'] for x in r['metrics'][k][:4]) for r in d['runs_detail']]
        row.append('%s %.0f' % (k, statistics.mean(xs)))
    print(f.split('/')[-1] + ':', ', '.join(row))
