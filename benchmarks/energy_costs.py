"""Energy's cost and sanity figures (DESIGN §18), as recorded in benchmarks/README.md ("Energy").

Run from the repository root: ``python benchmarks/energy_costs.py``. Prints, for a 32k decode run of opt2 and
opt3, the median of 11 cold runs (plan cache cleared) and of ``analysis.energy`` on each, whether other energy
keys change any op_log byte and whether the full path counts what the steady path does; for four model steps,
the step's wall time and ``Step.joules``'s; and the H200 sanity row with the same step on AHBM at three PE levels.
"""
import time, statistics, kbwork, numpy as np
from kbwork import decode, analysis, model
analysis.energy(decode.run("opt2", kv_len=1024, mode="timing"))
def med(xs): return statistics.median(xs)
for v in ("opt2","opt3"):
  rs=[];es=[]
  for rep in range(11):
    kbwork.clear_caches()
    t=time.perf_counter(); r = decode.run(v, kv_len=32768, mode="timing"); rs.append(time.perf_counter()-t)
    t=time.perf_counter(); analysis.energy(r); es.append(time.perf_counter()-t)
  base=decode.run(v, kv_len=32768, mode="timing"); other=decode.run(v, kv_len=32768, mode="timing", hbm_pj_per_bit=0.55, tcm_pj_per_byte=0, mac_pj=9, math_pj_per_element=0, dispatch_pj_per_cycle=0, pe_idle_mw=0)
  full=decode.run(v, kv_len=32768, mode="timing", steady_state=False)
  t=time.perf_counter(); analysis.energy(full); tf=time.perf_counter()-t
  print(f"{v} 32k steady: run {med(rs)*1e3:.1f} ms, analysis.energy {med(es)*1e3:.2f} ms ({med(es)/med(rs):.2f}x); op_log identical under other energy keys: {base.run.to_csv()==other.run.to_csv()}; cycles {base.cycles}; full path: run energy {tf*1e3:.2f} ms, counts equal {analysis.energy(full)['count'].equals(analysis.energy(base)['count'])}")
for m, b, c in (("llama-3-8b",64,2048),("llama-3-8b",64,8192),("llama-3-8b",16,32768),("llama-3-70b",16,8192)):
  ts=[];tj=[]
  for rep in range(3):
    kbwork.clear_caches()
    t=time.perf_counter(); s=model.step(m,[c]*b,check_capacity=False); ts.append(time.perf_counter()-t)
    t=time.perf_counter(); s.joules; tj.append(time.perf_counter()-t)
  print(f"{m} batch {b} at {c}: step {med(ts)*1e3:.0f} ms, Step.joules {med(tj)*1e3:.1f} ms ({med(tj)/med(ts):.1%})")
h=model.step("llama-3-8b",[2048]*64,placement="host")
print(f"H200 alone 8B b64 2k: {h.seconds*1e3:.2f} ms, {h.watts:.0f} W, {h.joules/h.batch:.4f} J/token; largest: host busy {h.energy.set_index('part').joules['host busy']/h.joules:.0%}")
a=model.step("llama-3-8b",[2048]*64)
for pj in (3.29,1.56,0.55):
  s=model.step("llama-3-8b",[2048]*64,hbm_pj_per_bit=pj)
  print(f"AHBM 8B b64 2k hbm_pj_per_bit {pj}: {s.seconds*1e3:.3f} ms, {s.joules:.3f} J, {s.watts:.0f} W, {s.tokens_per_j:.2f} tok/J")
