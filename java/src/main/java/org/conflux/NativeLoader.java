package org.conflux;

import java.io.IOException;
import java.io.InputStream;
import java.net.URL;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Properties;

/**
 * Loads libconflux_jni.so, trying in order: the system property {@code conflux.jni.library} or the
 * environment variable {@code CONFLUX_JNI_LIBRARY} (a file); the directory of the conflux jar (the
 * build tree keeps both in build/java); the install directory recorded in the jar at build time
 * (&lt;libdir&gt;/jni); the sibling layout share/java -&gt; lib/jni; then {@code java.library.path}; and
 * last, when none of these has it, the copies inside the jar (the Maven jar carries them in
 * native/&lt;os&gt;-&lt;arch&gt;/), extracted into a temporary folder that is deleted once they are loaded.
 */
final class NativeLoader {
    static final String NAME = "conflux_jni";
    private static boolean loaded;

    private NativeLoader() {
    }

    static synchronized void load() {
        if (loaded) {
            return;
        }
        String file = System.mapLibraryName(NAME);
        String explicit = System.getProperty("conflux.jni.library", System.getenv("CONFLUX_JNI_LIBRARY"));
        if (explicit != null && !explicit.isEmpty()) {
            System.load(Paths.get(explicit).toAbsolutePath().toString());
            loaded = true;
            return;
        }
        List<Path> tried = new ArrayList<>();
        for (Path dir : candidateDirs()) {
            Path p = dir.resolve(file);
            tried.add(p);
            if (Files.isRegularFile(p)) {
                System.load(p.toAbsolutePath().toString());
                loaded = true;
                return;
            }
        }
        try {
            System.loadLibrary(NAME);
            loaded = true;
        } catch (UnsatisfiedLinkError e) {
            if (loadBundled()) {
                loaded = true;
                return;
            }
            UnsatisfiedLinkError err = new UnsatisfiedLinkError("Conflux: cannot find " + file + " (tried "
                    + tried + " and java.library.path); set -Dconflux.jni.library=/path/to/" + file);
            err.initCause(e);
            throw err;
        }
    }

    /**
     * Loads the libraries the jar carries for this platform, in the order its LIBRARIES file lists
     * them (libconflux first, which libconflux_jni needs); false when it carries none.
     */
    private static boolean loadBundled() {
        String arch = System.getProperty("os.arch").replace("amd64", "x86_64");
        String dir = "native/" + System.getProperty("os.name").toLowerCase(Locale.ROOT) + "-" + arch + "/";
        List<String> names = new ArrayList<>();
        try (InputStream in = NativeLoader.class.getResourceAsStream(dir + "LIBRARIES")) {
            if (in == null) {
                return false;
            }
            for (String line : new String(in.readAllBytes(), StandardCharsets.UTF_8).split("\n")) {
                if (!line.isBlank()) {
                    names.add(line.trim());
                }
            }
        } catch (IOException e) {
            return false;
        }
        Path tmp = null;
        List<Path> files = new ArrayList<>();
        try {
            tmp = Files.createTempDirectory("conflux-native-");
            for (String name : names) {
                Path p = tmp.resolve(name);
                files.add(p);
                try (InputStream in = NativeLoader.class.getResourceAsStream(dir + name)) {
                    if (in == null) {
                        throw new UnsatisfiedLinkError("Conflux: the jar lists but lacks " + dir + name);
                    }
                    Files.copy(in, p);
                }
                System.load(p.toString());
            }
            return true;
        } catch (IOException e) {
            UnsatisfiedLinkError err = new UnsatisfiedLinkError("Conflux: cannot extract " + dir + " from the jar into "
                    + (tmp != null ? tmp : System.getProperty("java.io.tmpdir")) + ": " + e);
            err.initCause(e);
            throw err;
        } finally {
            // a loaded library stays mapped after its file is gone
            for (Path p : files) {
                p.toFile().delete();
            }
            if (tmp != null) {
                tmp.toFile().delete();
            }
        }
    }

    private static List<Path> candidateDirs() {
        List<Path> dirs = new ArrayList<>();
        try {
            URL loc = NativeLoader.class.getProtectionDomain().getCodeSource().getLocation();
            Path jar = Paths.get(loc.toURI());
            Path dir = Files.isDirectory(jar) ? jar : jar.getParent();
            if (dir != null) {
                dirs.add(dir);
            }
        } catch (Exception | Error ignored) {
            // no code source (custom class loader): fall through to the other places
        }
        try (InputStream in = NativeLoader.class.getResourceAsStream("native.properties")) {
            if (in != null) {
                Properties p = new Properties();
                p.load(in);
                String d = p.getProperty("jni.install.dir");
                if (d != null && !d.isEmpty()) {
                    dirs.add(Paths.get(d));
                }
            }
        } catch (Exception ignored) {
            // no recorded install dir
        }
        if (!dirs.isEmpty() && dirs.get(0).getParent() != null && dirs.get(0).getParent().getParent() != null) {
            dirs.add(dirs.get(0).getParent().getParent().resolve("lib").resolve("jni"));
        }
        return dirs;
    }
}
