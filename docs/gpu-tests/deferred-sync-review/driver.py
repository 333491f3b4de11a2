import sys,os,json
sys.path[:0]=['tests/gpu','.']
import gpu_harness as H
from pathlib import Path
from bench import client
from bench.server import resolve_tree
O=Path(os.environ['OUT']);lg=O/'logs';lg.mkdir(exist_ok=True)
t=resolve_tree();fx=H.FixtureSets();pair=sys.argv[1];be=sys.argv[2:3]
m=H.models_for(pair,fx);bf=['--attention-backend',be[0]] if be else []
B=client.load_prompts()
P=[f"Request {i}. {B[i%len(B)]}" for i in range(12)]
X={p:{"sampling_params":{"temperature":0,"max_new_tokens":24+16*i,"ignore_eos":True}} for i,p in enumerate(P)}
def go(n,spec):
  d={}
  try:
    r=H.run_server(n,spec,t,lg,[P],H.GREEDY,extra_by_prompt=X)
    d={"err":r.errors[:2],"ids":{x.prompt:x.output_ids for x in r.results},"acc":[(x.meta.get("spec_verify_ct"),H.accepted_drafts(x.meta),x.completion_tokens) for x in r.results],"ctr":str(r.counters())}
  except Exception as e: d["exc"]=repr(e)[:400]
  f=lg/f"{n}.log"
  if f.exists():
    L=f.read_text(errors="replace").splitlines();d["sw"]=sum("speculation O" in l for l in L)
    d["log"]=[l[-250:] for l in L if any(k in l for k in ("caught up","Traceback","Error","error:"))][:20]
  return d
R={}
F=['--moe-dense-tp-size','1'];N=H.nospec_spec(m,1,bf);S=lambda w,e=[]:H.switch_spec(m,w,1,extra=bf+e)
D={'nospec':N,'v2':S('v2'),'v2d':S('v2d'),'v2_mlp':S('v2',F),'v2d_mlp':S('v2d',F)};sf=be[0] if be else ''
for n in os.environ['RL'].split(','):
  spec=D[n];n=n+sf
  R[n]=go(n,spec); print(n,json.dumps({k:v for k,v in R[n].items() if k!="ids"})[:3000],flush=True)
ref=R.get('nospec'+sf,{}).get('ids')
for v in R.values():
  if ref and 'ids' in v: v['match']=sum(v['ids'].get(p)==q for p,q in ref.items())
  v.pop('ids',None)
json.dump(R,open(O/f'res{sf}.json','w'),indent=1)
