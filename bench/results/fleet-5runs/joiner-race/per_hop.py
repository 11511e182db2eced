import json,sys
d=json.load(open(sys.argv[1]))
for r in d['runs_detail']:
  m=r['metrics']
  out=[]
  for b0,j,b1 in [('v2_baseline','v3_joiner','v4_baseline'),('v4_baseline','v5_joiner','v6_baseline')]:
    row=[]
    for i in range(len(m[b0])):
      base=(m[b0][i]['transfer_ms']+m[b1][i]['transfer_ms'])/2
      row.append('r%d<%s %+.1f%%'%(i, m[j][i]['holders'].split('=')[0].replace('relay:','R').replace('trainer:0','T'), 100*(m[j][i]['transfer_ms']/base-1)))
    jn=m[j][len(m[b0])]
    out.append(' '.join(row)+' | J<%s b%.0f x%.0f'%(jn['holders'].split('=')[0].replace('relay:','R').replace('trainer:0','T'),jn['begin_ms'],jn['transfer_ms']))
  ctrl=[]
  for i in range(len(m['v2_baseline'])):
    base=(m['v2_baseline'][i]['transfer_ms']+m['v6_baseline'][i]['transfer_ms'])/2
    ctrl.append('%+.1f'%(100*(m['v4_baseline'][i]['transfer_ms']/base-1)))
  print(' || '.join(out), '| ctrl', ' '.join(ctrl), 'steal %.3f'%m.get('cpu_steal_baseline',0))
