"""Lists the pairs of files of src/ that import each other (a path through
crate::, super:: or self:: that reaches the other file's module), a module and
its own child excepted. Prints nothing, and exits 0, when there are none; run
from the repository's root (.ci/run does).

    python3 scripts/import_cycles.py
"""
import re, os, glob
root='src'
files=[f for f in glob.glob('src/**/*.rs', recursive=True)]
def modpath(f):
    p=f[len('src/'):-3].split('/')
    if p[-1] in ('mod','lib','main'): p=p[:-1]
    return p
mods={tuple(modpath(f)):f for f in files}
def resolve(cur, path):
    # path list starting with crate/super/self
    if path[0]=='crate': base=[]; rest=path[1:]
    elif path[0]=='super':
        base=list(cur); 
        # for mod.rs, cur is the module itself
        rest=path
        while rest and rest[0]=='super': base=base[:-1]; rest=rest[1:]
    elif path[0]=='self': base=list(cur); rest=path[1:]
    else: return None
    full=base+rest
    # longest prefix that is a module
    for n in range(len(full),-1,-1):
        if tuple(full[:n]) in mods: return mods[tuple(full[:n])]
    return None
edges={}
for f in files:
    cur=modpath(f)
    # for a non-mod file, 'super' refers to parent: cur should be its module path
    text=open(f).read()
    text=re.sub(r'//[^\n]*','',text)
    deps=set()
    for m in re.finditer(r'\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)', text):
        parts=m.group(1).split('::')
        r=resolve(cur, parts)
        if r and r!=f: deps.add(r)
    # use super::{a, b::c} groups
    for m in re.finditer(r'use\s+(crate|super)::\{([^;]*)\};', text, re.S):
        for item in re.split(r',', m.group(2)):
            item=item.strip().split('::')[0].strip('{} \n')
            if item:
                r=resolve(cur,[m.group(1),item])
                if r and r!=f: deps.add(r)
    edges[f]=deps
pairs=set()
for a in files:
    for b in edges[a]:
        if a in edges.get(b,()):
            pairs.add(tuple(sorted((a,b))))
for a, b in sorted(pairs):
    print(f"{a} <-> {b}")
raise SystemExit(1 if pairs else 0)
