#!/usr/bin/env bash
# Maven, offline against Debian's repository: `mvn install` of the project CMake staged in
# <build>/maven (copied here) into a local repository; the JUnit suites through Surefire as 2 ranks
# (one Maven per rank under mpirun); then a separate consumer project that depends on
# org.conflux:conflux:<version> builds from that repository and runs a 2-rank allreduce against the
# ranks' sum, with its JNI library extracted from the jar (nothing installed is on its path).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
need mvn "Debian: maven"
[[ -d /usr/share/maven-repo/org/apache/maven/plugins/maven-surefire-plugin ]] \
    || skip "Debian's Maven plugins are missing (libsurefire-java libmaven-compiler-plugin-java ...)"
java=${CFX_JAVA:-java}
v=$CFX_VERSION
[[ -f $CFX_BUILD/maven/pom.xml ]] || fail "no $CFX_BUILD/maven/pom.xml (target conflux_maven_project)"
repo=$work/repo
# (the projects' .mvn/maven.config add -Daether.offline.protocols=file: Debian's file:// repository)
mvn=(mvn -o -B -ntp -Dstyle.color=never "-Dmaven.repo.local=$repo")

step "mvn install (the staged project, copied)"
mkdir "$work/project"
tar -C "$CFX_BUILD/maven" --exclude=./target -cf - . | tar -C "$work/project" -xf -
logged "$work/install.log" "${mvn[@]}" -f "$work/project/pom.xml" install
grep -q "Tests are skipped" "$work/install.log" || fail "mvn install outside mpirun ran the multi-rank suites"
jar=$repo/org/conflux/conflux/$v/conflux-$v.jar
[[ -f $jar && -f $repo/org/conflux/conflux/$v/conflux-$v.pom ]] || fail "mvn install put no conflux-$v.jar/.pom in $repo"
listing=$(zip_list "$jar")
natives=org/conflux/native/linux-$(uname -m)
grep -qx "$natives/LIBRARIES" <<<"$listing" || fail "the jar lacks $natives/LIBRARIES"
libs=$(zip_cat "$jar" "$natives/LIBRARIES")
grep -qx 'libconflux\.so\.[0-9]*' <<<"$libs" && grep -qx libconflux_jni.so <<<"$libs" \
    || fail "$natives/LIBRARIES does not list libconflux.so.<ABI> and libconflux_jni.so: $libs"
for f in $libs; do
    grep -qx "$natives/$f" <<<"$listing" || fail "the jar lists but lacks $natives/$f"
done
echo "jar: $(grep -c . <<<"$listing") entries, natives: $(grep "^$natives/." <<<"$listing" | tr '\n' ' ')"

step "Surefire: the JUnit suites as 2 ranks"
out=$(cd / && "$MPIEXEC" -n 2 --timeout 200 "${mvn[@]}" -f "$work/project/pom.xml" surefire:test 2>&1) \
    || { echo "$out"; fail "Surefire under mpirun"; }
grep -E "Tests run:|BUILD" <<<"$out"
for r in 0 1; do
    reports=$work/project/target/surefire-reports/rank-$r
    n=$(cat "$reports"/TEST-*.xml 2>/dev/null | grep -o '<testsuite [^>]*' | sed -n 's/.* tests="\([0-9]*\)".*/\1/p' |
        awk '{ s += $1 } END { print s + 0 }')
    bad=$(cat "$reports"/TEST-*.xml | grep -o '<testsuite [^>]*' | grep -cE '(failures|errors)="[1-9]' || true)
    ((n > 0)) || fail "rank $r: no Surefire reports with tests in $reports"
    ((bad == 0)) || fail "rank $r: $bad test classes with failures or errors (reports: $reports)"
    echo "rank $r: $n tests passed (Surefire reports)"
done

step "a consumer project depending on org.conflux:conflux:$v"
mkdir "$work/consumer"
cp -r "$here/maven-consumer/src" "$here/maven-consumer/.mvn" "$work/consumer/"
sed "s/@CONFLUX_VERSION@/$v/" "$here/maven-consumer/pom.xml.in" >"$work/consumer/pom.xml"
logged "$work/consumer.log" "${mvn[@]}" -f "$work/consumer/pom.xml" package
mkdir "$work/tmp"
out=$(ranks 2 "$java" -Djava.library.path="$work/none" -Djava.io.tmpdir="$work/tmp" \
      -cp "$work/consumer/target/conflux-consumer-1.jar:$jar" org.example.Consumer 2)
echo "$out"
n=$(grep -c "JNI library $work/tmp/conflux-native-[^/]*/libconflux_jni.so (deleted)" <<<"$out" || true)
((n == 2)) || fail "the ranks' JNI library was not the copy extracted from the jar into $work/tmp"
[[ -z $(ls -A "$work/tmp") ]] || fail "extracted files left behind in $work/tmp: $(ls -A "$work/tmp")"
echo "ok"
