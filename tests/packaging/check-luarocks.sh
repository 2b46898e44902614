#!/usr/bin/env bash
# LuaRocks: `luarocks make lua/conflux-<version>-1.rockspec --tree T` in a copy of the source tree
# (the rock builds in build.luarocks/ there), then a fresh lua5.4 with only T's paths requires
# "conflux" and runs a 2-rank allreduce against the ranks' sum. The rockspec must carry CMake's
# project version in its name and its version field.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
need luarocks "Debian: luarocks"
lua=${CFX_LUA:-lua5.4}
spec=lua/conflux-$CFX_VERSION-1.rockspec
[[ -f $CFX_SRC/$spec ]] || fail "no $spec: the rockspec's name must carry CMake's project version" \
    "$CFX_VERSION (found: $(cd "$CFX_SRC" && ls lua/*.rockspec))"
grep -q "^version = \"$CFX_VERSION-1\"" "$CFX_SRC/$spec" || fail "$spec: version is not \"$CFX_VERSION-1\""

step "copy the source tree (no build folders)"
mkdir "$work/src"
tar -C "$CFX_SRC" --exclude='./build*' --exclude=./.git -cf - . | tar -C "$work/src" -xf -

step "luarocks make $spec --tree $work/tree"
(cd "$work/src" && CONFLUX_CMAKE_ARGS="${CFX_SUBBUILD_ARGS:-}" logged "$work/luarocks.log" \
    luarocks --lua-version=5.4 make "$spec" --tree "$work/tree")
luarocks --lua-version=5.4 list --tree "$work/tree" --porcelain | grep -q "^conflux	$CFX_VERSION-1	installed" \
    || fail "luarocks list does not show conflux $CFX_VERSION-1 installed in $work/tree"
(cd "$work/tree" && find . -type f -o -type l | sort | sed 's|^\./|  |')

step "a fresh $lua with the tree's paths: require \"conflux\", 2 ranks"
rm -rf "$work/src"
unset LUA_PATH_5_4 LUA_CPATH_5_4
eval "$(luarocks --lua-version=5.4 path --tree "$work/tree")"
ranks 2 "$lua" "$here/allreduce_check.lua" "$work/tree" 2
echo "ok"
